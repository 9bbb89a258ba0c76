//! A query string extractor whose refusal is the API's error body (a `400` naming the
//! problem), not axum's plain text.

use super::error::ApiError;
use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

pub struct StrictQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for StrictQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(query)| StrictQuery(query))
            .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
    }
}
