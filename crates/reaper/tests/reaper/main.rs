//! The reaper against the real PostgreSQL and a real local artifact store: one test
//! binary, its rules one by one and a soak of random histories.

mod retention;
mod soak;
