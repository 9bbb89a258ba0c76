//! The worker's parts on this host: the step's isolation, the workspace janitor and the
//! verification scope. One test binary, one module each.

mod isolation;
mod janitor;
mod scope;
