//! Requests' signals: PostgreSQL notifies every change of a request's cancel or pause
//! request on one channel (migration 0014), and the keeper of that request, if it runs
//! here, reads them at once instead of at its next renewal, so a cancel lands within a
//! second. A notification missed while the listener reconnects waits for that renewal.

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub const CHANNEL: &str = "cairn_request_signals";

/// The keepers of this process waiting for their request's signals.
#[derive(Default)]
pub struct Signals {
    waiting: Mutex<HashMap<Uuid, Arc<Notify>>>,
}

/// A keeper's subscription to its request's signals; dropping it ends it.
pub struct Subscription {
    signals: Arc<Signals>,
    request_id: Uuid,
    pub wake: Arc<Notify>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // A fenced job may still be letting go while a new claim of the same request
        // subscribed: only this subscription's own entry goes.
        let mut waiting = self.signals.waiting();
        if waiting
            .get(&self.request_id)
            .is_some_and(|w| Arc::ptr_eq(w, &self.wake))
        {
            waiting.remove(&self.request_id);
        }
    }
}

impl Signals {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<Notify>>> {
        // A panic while holding this lock leaves a map still worth using.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(self: &Arc<Self>, request_id: Uuid) -> Subscription {
        let wake = Arc::new(Notify::new());
        self.waiting().insert(request_id, wake.clone());
        Subscription {
            signals: self.clone(),
            request_id,
            wake,
        }
    }

    /// Wakes the keeper of `request_id`, if it runs here; a signal before it waits is kept.
    pub fn signal(&self, request_id: Uuid) {
        if let Some(wake) = self.waiting().get(&request_id) {
            wake.notify_one();
        }
    }

    /// Listens until `shutdown`, reconnecting after a lost connection.
    pub async fn listen(self: Arc<Self>, pool: PgPool, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            if let Err(e) = self.listen_once(&pool, &shutdown).await {
                tracing::warn!(error = %e, "request signals unavailable; keepers read them at each renewal meanwhile");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }

    async fn listen_once(
        &self,
        pool: &PgPool,
        shutdown: &CancellationToken,
    ) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(CHANNEL).await?;
        loop {
            let notification = tokio::select! {
                n = listener.recv() => n?,
                _ = shutdown.cancelled() => return Ok(()),
            };
            match notification.payload().parse::<Uuid>() {
                Ok(request_id) => self.signal(request_id),
                Err(_) => tracing::warn!(
                    payload = notification.payload(),
                    "a request signal without a request id"
                ),
            }
        }
    }
}
