//! A fresh, migrated database of its own for one benchmark, dropped after it.

use sqlx::PgPool;

pub struct Scratch {
    admin: PgPool,
    name: String,
    /// The database's URL.
    pub url: String,
    /// A short random stamp, unique to this benchmark, for its other resources' names.
    pub stamp: String,
}

impl Scratch {
    /// Creates the database on the server at `postgres` and migrates it.
    pub async fn create(postgres: &str) -> anyhow::Result<Scratch> {
        let stamp = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let name = format!("cairn_bench_{stamp}");
        let server = postgres.trim_end_matches('/');
        let admin = PgPool::connect(&format!("{server}/postgres")).await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&admin)
            .await?;
        let scratch = Scratch {
            admin,
            url: format!("{server}/{name}"),
            name,
            stamp,
        };
        let migrated = async {
            let pool = PgPool::connect(&scratch.url).await?;
            cairn_common::db::migrate(&pool).await?;
            pool.close().await;
            anyhow::Ok(())
        }
        .await;
        match migrated {
            Ok(()) => Ok(scratch),
            Err(e) => {
                scratch.remove().await?;
                Err(e)
            }
        }
    }

    /// Drops the database, with whatever connections are still open to it.
    pub async fn remove(self) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}
