// Re-embed the migrations whenever one is added or changed (sqlx's `migrate!` reads the
// directory at compile time).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
