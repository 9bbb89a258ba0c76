//! The OpenAPI 3 document, generated from the handlers' annotations and types.

use super::{
    continuation, credentials, error, network_policy, overview, pause, policy, publication,
    qualification, queues, reaper, runs, sandboxes, session, tenants, tokens, verification,
    workers,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The run feed's `Last-Event-ID`: what a position may be made of
/// ([`super::runs::position`]).
pub const FEED_POSITION: &str = "^[0-9a-f:,;]{1,50000}$";

#[derive(OpenApi)]
#[openapi(
    info(title = "Cairn scheduler API", description = "Admission of runs, reviewed continuations and verification handoffs; sandboxes."),
    paths(
        runs::admission::submit, runs::admission::submit_batch, runs::view::list, runs::view::counts, runs::events::events,
        runs::view::show, runs::cancel, runs::view::execution_requests, runs::journal::journal, runs::output::output,
        runs::rerun::rerun, runs::bulk::bulk, runs::reconciliation::show, runs::reconciliation::list, runs::reconciliation::read, runs::reconciliation::decide, pause::pause, pause::resume, pause::show,
        policy::get_policy, policy::put_policy, qualification::show, qualification::set,
        publication::request, publication::show, publication::hold, publication::set_hold, publication::clear_hold,
        continuation::checkpoint_candidate, continuation::checkpoint_action, continuation::checkpoint_status,
        continuation::final_candidate, continuation::final_action, continuation::final_status,
        verification::candidates, verification::adopt, verification::adoptions, verification::adoption,
        tokens::create, tokens::list, tokens::revoke, tenants::create, tenants::list,
        network_policy::show, network_policy::set, session::show, credentials::rotate, workers::list, queues::show, reaper::show, overview::show,
        sandboxes::create::create, sandboxes::view::list, sandboxes::view::show, sandboxes::view::operations,
        sandboxes::lifecycle::stop, sandboxes::lifecycle::pause, sandboxes::lifecycle::resume, sandboxes::lifecycle::destroy, sandboxes::lifecycle::extend,
        sandboxes::operations::exec, sandboxes::output::output, sandboxes::view::show_operation, sandboxes::operations::list, sandboxes::operations::read, sandboxes::operations::write,
        sandboxes::fork::fork, sandboxes::preview::preview, sandboxes::services::set, sandboxes::services::delete, sandboxes::snapshots::create, sandboxes::snapshots::list, sandboxes::snapshots::show,
        sandboxes::snapshots::delete, sandboxes::snapshots::restore,
        sandboxes::templates::create, sandboxes::templates::list, sandboxes::templates::show,
        sandboxes::control::input, sandboxes::control::resize, sandboxes::control::kill,
        sandboxes::volumes::create, sandboxes::volumes::list, sandboxes::volumes::show, sandboxes::volumes::delete,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail)),
    tags(
        (name = "runs", description = "Runs: submission, reading, journal, output, cancel, pause and resume."),
        (name = "continuations", description = "Reviewed continuations of a run's request: candidates, one caller-owned action each, status."),
        (name = "verification", description = "Verification handoffs: the checks a final report asks for, adopted by a person."),
        (name = "publication", description = "Publishing a completed run's result, and the delivery hold that stops it."),
        (name = "policy", description = "The continuation policy (invalid-read continuity)."),
        (name = "qualification", description = "Source profiles: which runtimes may continue a checkpoint."),
        (name = "sandboxes", description = "Sandboxes: lifecycle, exec, files, forks."),
        (name = "snapshots", description = "Sandbox snapshots: list, read, restore, delete."),
        (name = "tokens", description = "API tokens and their roles."),
        (name = "tenants", description = "Tenants and their steps' network policy."),
        (name = "session", description = "The calling token."),
        (name = "credentials", description = "Agent credentials."),
        (name = "workers", description = "The worker fleet and its leases."),
        (name = "reaper", description = "The reaper's sweeps and pending repairs."),
        (name = "overview", description = "The fleet over time: the console's charts."),
    ),
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

/// The document as JSON text, with what every operation shares ([`complete`]).
pub fn json() -> String {
    let Ok(mut doc) = serde_json::to_value(ApiDoc::openapi()) else {
        return String::new();
    };
    complete(&mut doc);
    list_error_codes(&mut doc);
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// Lists every error code (`x-error-codes`: code → usual status and meaning), so a
/// client can name one class per code.
fn list_error_codes(doc: &mut serde_json::Value) {
    let codes: serde_json::Map<String, serde_json::Value> = super::error_codes::ERROR_CODES
        .iter()
        .map(|(code, status, meaning)| {
            let entry = serde_json::json!({"status": status, "description": meaning});
            (code.to_string(), entry)
        })
        .collect();
    doc["x-error-codes"] = serde_json::Value::Object(codes);
}

/// The component schemas a request body uses, directly or through others.
fn request_schemas(doc: &serde_json::Value) -> std::collections::BTreeSet<String> {
    fn refs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(name) = map
                    .get("$ref")
                    .and_then(|r| r.as_str())
                    .and_then(|r| r.strip_prefix("#/components/schemas/"))
                {
                    out.push(name.to_string());
                }
                map.values().for_each(|v| refs(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut pending = Vec::new();
    if let Some(paths) = doc.get("paths").and_then(|p| p.as_object()) {
        for operation in paths
            .values()
            .filter_map(|p| p.as_object())
            .flat_map(|p| p.values())
        {
            if let Some(body) = operation.get("requestBody") {
                refs(body, &mut pending);
            }
        }
    }
    let mut found = std::collections::BTreeSet::new();
    while let Some(name) = pending.pop() {
        if found.insert(name.clone()) {
            if let Some(schema) = doc.pointer(&format!("/components/schemas/{name}")) {
                refs(schema, &mut pending);
            }
        }
    }
    found
}

/// Every free-form string the server stores refuses a NUL (a 400 naming the field): a
/// string schema with no pattern, format or set of values says so.
fn no_nul_in_strings(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(map) => {
            let is_string = match map.get("type") {
                Some(serde_json::Value::String(t)) => t == "string",
                Some(serde_json::Value::Array(types)) => types.iter().any(|t| t == "string"),
                _ => false,
            };
            let open = !["pattern", "format", "enum", "const"]
                .iter()
                .any(|k| map.contains_key(*k));
            if is_string && open {
                map.insert("pattern".into(), "^[^\\u0000]*$".into());
            }
            map.values_mut().for_each(no_nul_in_strings);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(no_nul_in_strings),
        _ => {}
    }
}

/// What a response of `status` is, where its annotation does not say.
fn status_meaning(status: &str) -> &'static str {
    match status {
        "200" => "OK",
        "201" => "Created (or the identical earlier receipt)",
        "202" => "Accepted: the work goes on; read its status",
        "204" => "No content",
        "400" | "401" | "403" | "404" | "405" | "409" | "410" | "413" | "415" | "422" => {
            "The error body"
        }
        _ => "The answer",
    }
}

/// The schema of a path parameter, by its name.
fn path_schema(name: &str) -> serde_json::Value {
    let pattern = match name {
        // A preview's port, and the path in the sandbox's server (any).
        "port" => return serde_json::json!({"type": "integer", "minimum": 1, "maximum": 65535}),
        "path" => return serde_json::json!({"type": "string"}),
        // Not only dots: `.` and `..` are path segments clients resolve.
        "name" => "^(?!\\.+$)[A-Za-z0-9._-]{1,63}$",
        "agent" => "^[A-Za-z0-9._-]{1,128}$",
        "step_key" => "^[A-Za-z0-9._-]{1,64}$",
        "profile_digest" => "^[0-9a-f]{64}$",
        _ => "^[0-9a-f]{32}$",
    };
    serde_json::json!({"type": "string", "pattern": pattern})
}

/// Adds what the handlers' annotations leave implicit, so that a client generated from
/// the document meets the server: the statuses every operation can answer (a bad
/// token 401, a role too low 403, an unreadable or too large body 413, a body that is
/// not JSON 415, an unavailable database 503, each with the error body), a description
/// on every response, and the
/// patterns the server enforces on path parameters (ids: 32 lowercase hex; agent
/// names; step keys).
/// The schema of a parameter the handlers' types cannot state, if it is one.
fn param_schema(path: &str, name: &str, place: &serde_json::Value) -> Option<serde_json::Value> {
    match name {
        "Idempotency-Key" => {
            Some(serde_json::json!({"type": "string", "pattern": "^[!-~]([ -~]{0,253}[!-~])?$"}))
        }
        // An event stream's position: an output's `EPOCH:SEQ`, or the run feed's
        // snapshots (`XMIN:XMAX:XIP,…`, `;`-separated, whose order no pattern states: a
        // 422).
        "Last-Event-ID" if path.ends_with("/output") => {
            Some(serde_json::json!({"type": "string", "pattern": "^[0-9]{1,18}:[0-9]{1,19}$"}))
        }
        "Last-Event-ID" => Some(serde_json::json!({"type": "string", "pattern": FEED_POSITION})),
        _ if place == "path" => Some(path_schema(name)),
        _ => None,
    }
}

fn complete(doc: &mut serde_json::Value) {
    use serde_json::json;
    let error = json!({
        "description": "The error body",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    });
    let bodies = request_schemas(doc);
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    {
        for (name, schema) in schemas.iter_mut() {
            if bodies.contains(name) {
                no_nul_in_strings(schema);
            }
        }
    }
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            if !matches!(method.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                continue;
            }
            let has_body = operation.get("requestBody").is_some();
            let has_params = operation
                .get("parameters")
                .is_some_and(|p| p.as_array().is_some_and(|a| !a.is_empty()));
            if let Some(params) = operation
                .get_mut("parameters")
                .and_then(|p| p.as_array_mut())
            {
                for param in params {
                    let name = param["name"].as_str().unwrap_or_default().to_string();
                    if let Some(schema) = param_schema(path, &name, &param["in"]) {
                        param["schema"] = schema;
                    }
                }
            }
            let Some(responses) = operation
                .get_mut("responses")
                .and_then(|r| r.as_object_mut())
            else {
                continue;
            };
            let mut statuses = vec!["401", "403", "503"];
            if has_body {
                statuses.extend(["400", "413", "415"]);
            } else if has_params {
                statuses.push("400");
            }
            for status in statuses {
                responses.entry(status).or_insert_with(|| error.clone());
            }
            for (status, response) in responses.iter_mut() {
                if response["description"].as_str().is_none_or(str::is_empty) {
                    response["description"] = json!(status_meaning(status));
                }
            }
        }
    }
}
