//! Every HTTP error the server sends: one enum, rendered as OpenAI's error JSON
//! `{"error": {"message", "type", "param", "code"}}` with its status.
//!
//! Invariants: bad input is always a 4xx naming the field (`param`) and the problem; a 500 is
//! only ever an engine failure, never a consequence of what the client sent. Engine refusals
//! (`SubmitError`) map here in one place.
//! Rejected: axum's default rejections (plain-text bodies, 422 for JSON type errors): OpenAI
//! clients parse the error object and expect 400 for a bad request.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tf_engine::serve::api::SubmitError;

/// An HTTP error response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: one field of the request is wrong.
    #[error("{message}")]
    InvalidField { param: String, message: String },
    /// 400: the body is not a JSON object (syntax, encoding or top-level type).
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// 400: the request is well formed but cannot be served as asked.
    #[error("{0}")]
    BadRequest(String),
    /// 400: prompt plus `max_tokens` exceed the context.
    #[error("{0}")]
    ContextLength(String),
    /// 401: `--api-key` is set and the request lacks it.
    #[error("invalid or missing API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// 404: `model` names a model this server does not serve.
    #[error("the model `{requested}` does not exist; this server serves `{served}`")]
    ModelNotFound { requested: String, served: String },
    /// 404: no such route.
    #[error("no route for {0}")]
    NotFound(String),
    /// 405: the route exists, the method does not.
    #[error("method {method} is not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// 413: the body exceeds the configured limit.
    #[error("the request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// 429: the engine's waiting queue is full.
    #[error("{0}")]
    QueueFull(String),
    /// 503: the server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// 500: the engine failed (never caused by input).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        ApiError::InvalidField { param: param.to_string(), message: message.into() }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidField { .. }
            | ApiError::MalformedJson(_)
            | ApiError::BadRequest(_)
            | ApiError::ContextLength(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound { .. } | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code` strings.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::InvalidField { .. } => ("invalid_request_error", "invalid_value"),
            ApiError::MalformedJson(_) => ("invalid_request_error", "invalid_json"),
            ApiError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ApiError::ContextLength(_) => ("invalid_request_error", "context_length_exceeded"),
            ApiError::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            ApiError::ModelNotFound { .. } => ("invalid_request_error", "model_not_found"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
            ApiError::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            ApiError::BodyTooLarge { .. } => ("invalid_request_error", "body_too_large"),
            ApiError::QueueFull(_) => ("rate_limit_error", "queue_full"),
            ApiError::ShuttingDown => ("service_unavailable", "shutting_down"),
            ApiError::Internal(_) => ("server_error", "internal_error"),
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidField { param, .. } => Some(param),
            ApiError::ModelNotFound { .. } => Some("model"),
            _ => None,
        }
    }

    /// The error object, as sent in a response body or an SSE `data:` line.
    pub fn to_json(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        json!({"error": {
            "message": self.to_string(),
            "type": kind,
            "param": self.param(),
            "code": code,
        }})
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull { .. } => ApiError::QueueFull(e.to_string()),
            SubmitError::TooLong { .. } => ApiError::ContextLength(e.to_string()),
            SubmitError::Invalid(m) => ApiError::BadRequest(m),
            SubmitError::ShuttingDown => ApiError::ShuttingDown,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.to_json())).into_response();
        let headers = response.headers_mut();
        match self {
            ApiError::QueueFull(_) | ApiError::ShuttingDown => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_errors_map_to_their_statuses() {
        let cases = [
            (SubmitError::QueueFull { waiting: 3, limit: 3 }, 429),
            (SubmitError::TooLong { prompt: 9, max_tokens: 9, needed: 18, context: 16 }, 400),
            (SubmitError::Invalid("x".into()), 400),
            (SubmitError::ShuttingDown, 503),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e.clone()).status().as_u16(), status, "{e:?}");
        }
    }

    #[test]
    fn error_json_has_the_openai_shape() {
        let v = ApiError::field("top_p", "top_p must be in (0, 1]").to_json();
        assert_eq!(v["error"]["param"], "top_p");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "top_p must be in (0, 1]");
        assert!(ApiError::Unauthorized.to_json()["error"]["param"].is_null());
    }
}
