//! API errors: a status code and a stable machine-readable body,
//! `{"error": {"code", "message", "field"}}`. Internals never reach the client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

/// The error body every failing route returns.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code for programs, e.g. `invalid_body`, `action_id_conflict`.
    pub code: String,
    /// Explanation for people.
    pub message: String,
    /// The offending field, when one is to blame (`steps[2].argv`).
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            message,
        )
        .with_field(field)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer <token>)",
        )
    }

    pub fn invalid_id(field: &str) -> Self {
        Self::bad_request(
            "invalid_id",
            format!("{field} must be exactly 32 lowercase hexadecimal characters"),
        )
        .with_field(field)
    }
}

impl From<cairn_common::run::FieldError> for ApiError {
    fn from(e: cairn_common::run::FieldError) -> Self {
        ApiError::unprocessable(e.field, e.message)
    }
}

impl From<cairn_common::request::Error> for ApiError {
    fn from(e: cairn_common::request::Error) -> Self {
        match e {
            cairn_common::request::Error::Db(e) => e.into(),
            // The request moved between the read and the write of this call: the
            // transition table refused, and the transaction changes nothing.
            cairn_common::request::Error::Refused(r) => {
                ApiError::conflict("state_changed", format!("{r}; nothing was changed"))
            }
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        tracing::error!(error = %e, "database error while serving a request");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database did not answer; nothing was changed, try again",
        )
    }
}

/// The code of an error answer, kept on the response for the layers around the
/// handlers (a preview route names it in a header).
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = ErrorCode(self.code);
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                field: self.field,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        response.extensions_mut().insert(code);
        response
    }
}
