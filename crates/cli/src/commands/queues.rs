//! `cairnctl queues`: the runs held by flow control, queued and executing, the workers'
//! slots, and how each concurrency or rate key stands.

use crate::client::{exit, CallError, Client};
use crate::output;

pub async fn queues(client: &Client, json: bool) -> Result<u8, CallError> {
    let view = client.get("/api/v1/queues").await?;
    if json {
        output::json(&view);
        return Ok(exit::OK);
    }
    let runs = &view["runs"];
    println!(
        "runs: {} held by flow control, {} queued for a worker, {} executing; {} run slots on live workers",
        output::text(&runs["held"]),
        output::text(&runs["queued"]),
        output::text(&runs["executing"]),
        output::text(&runs["slots"]),
    );
    let rows = output::rows(&view["keys"], |k| {
        output::cells(
            k,
            &["tenant", "key", "kind", "waiting", "in_flight", "limit"],
        )
    });
    if rows.is_empty() {
        println!("no concurrency or rate key has runs waiting or in flight");
    } else {
        println!();
        output::table(
            &["tenant", "key", "kind", "waiting", "in flight", "limit"],
            &rows,
        );
    }
    Ok(exit::OK)
}
