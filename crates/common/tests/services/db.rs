//! Opening the database as processes do at start, against the real PostgreSQL.

use cairn_common::{db, testing};

/// Processes started together on a database that does not exist yet all come up: for
/// every process that loses the creation race, the database "already exists", however
/// PostgreSQL words it.
#[tokio::test]
async fn processes_racing_to_create_the_database_all_come_up() {
    for _ in 0..5 {
        let name = testing::database_name();
        let url = format!("{}/{name}", testing::postgres_server_url());
        let racing = (0..6).map(|_| db::create_if_missing(&url));
        let results = futures::future::join_all(racing).await;
        testing::drop_database_blocking(&name);
        for result in results {
            assert!(result.is_ok(), "a racing process failed: {result:?}");
        }
    }
}
