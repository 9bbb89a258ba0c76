//! The OpenAPI 3 document, generated from the handlers' annotations and types.

use super::{continuation, credentials, error, pause, policy, runs, tokens, verification};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "Cairn scheduler API", description = "Admission of runs, reviewed continuations and verification handoffs."),
    paths(
        runs::admission::submit, runs::admission::submit_batch, runs::view::list,
        runs::view::show, runs::cancel, runs::view::execution_requests, runs::journal::journal, pause::pause, pause::resume, pause::show,
        policy::get_policy, policy::put_policy,
        continuation::checkpoint_candidate, continuation::checkpoint_action, continuation::checkpoint_status,
        continuation::final_candidate, continuation::final_action, continuation::final_status,
        verification::candidates, verification::adopt, verification::adoption,
        tokens::create, tokens::revoke, credentials::rotate,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The document as JSON text.
pub fn json() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}
