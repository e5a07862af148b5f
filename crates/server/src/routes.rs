//! The router: OpenAI routes under `/v1` (behind the API key when one is set), `/health` and
//! `/metrics` (open, for probes and scrapers), and JSON errors for unknown paths (404),
//! wrong methods (405) and oversized bodies (413).
//!
//! Invariants: every response a client can provoke is either a success or an `ApiError`
//! (no axum plain-text rejections); tokenization and template rendering run on the blocking
//! pool, so a 4 MiB prompt never stalls the async workers that stream other replies; the
//! request's `Submission` is owned by the response (the `Run` inside the SSE body or the
//! handler future), so a client that leaves cancels its request.
//! Rejected: a `Json<Value>` extractor (its rejections are plain text with 415/422).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use crate::errors::ApiError;
use crate::openai::{Ids, ModelCard, ModelList, ReplyMeta};
use crate::stream::{sse, Run, Step, StreamOpts};
use crate::validate::Endpoint;
use crate::AppState;

/// The whole HTTP surface over `state`.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let limit = state.config().body_limit;
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), count_responses))
        .with_state(state)
}

async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, Endpoint::Chat, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, Endpoint::Completion, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// Validate, submit, answer (streamed or whole).
async fn generate(
    state: AppState,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| body_error(&state, rejection))?;
    if state.is_stopping() {
        return Err(ApiError::ShuttingDown);
    }
    let st = state.clone();
    let plan = tokio::task::spawn_blocking(move || st.plan(endpoint, &body))
        .await
        .map_err(|e| ApiError::Internal(format!("request validation did not complete: {e}")))??;
    let prompt_ids = plan.return_token_ids.then(|| plan.request.prompt.clone());
    let prompt_len = plan.request.prompt.len();
    let submission = state.engine().submit(plan.request)?;
    let config = state.config();
    let run = Run::new(submission, config.codec.clone(), prompt_len, plan.stop);
    let meta = ReplyMeta::new(endpoint, &config.model_id);
    if plan.stream {
        let opts = StreamOpts { include_usage: plan.include_usage, prompt_ids };
        return Ok(sse(run, meta, opts).into_response());
    }
    complete(run, meta, prompt_ids).await
}

/// A non-streaming answer: drive the run to its end.
async fn complete(
    mut run: Run,
    meta: ReplyMeta,
    prompt_ids: Option<Vec<u32>>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(step) = run.next().await {
        match step {
            Step::Delta(d) => {
                text.push_str(&d.text);
                ids.extend(d.ids);
            }
            Step::End { delta, finish, usage } => {
                text.push_str(&delta.text);
                ids.extend(delta.ids);
                let ids = prompt_ids.map(|prompt| Ids { prompt, completion: ids });
                return Ok(json_body(StatusCode::OK, meta.full(text, finish, usage, ids)));
            }
            Step::Failed(message) => return Err(ApiError::Internal(message)),
        }
    }
    Err(ApiError::Internal("the request ended without a result".into()))
}

fn body_error(state: &AppState, rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::BodyTooLarge { limit: state.config().body_limit }
    } else {
        ApiError::BadRequest(format!("cannot read the request body: {}", rejection.body_text()))
    }
}

fn json_body(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn model_card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.config().model_id.clone(),
        object: "model",
        created: 0,
        owned_by: "tensorfold",
        max_model_len: state.engine().info().context,
    }
}

async fn models(State(state): State<AppState>) -> Response {
    let list = ModelList { object: "list", data: vec![model_card(&state)] };
    axum::Json(list).into_response()
}

async fn model(State(state): State<AppState>, id: Result<Path<String>, PathRejection>) -> Response {
    let card = model_card(&state);
    match id {
        Ok(Path(id)) if id == card.id => axum::Json(card).into_response(),
        Ok(Path(id)) => ApiError::ModelNotFound { requested: id, served: card.id }.into_response(),
        Err(e) => ApiError::BadRequest(e.body_text()).into_response(),
    }
}

async fn health(State(state): State<AppState>) -> Response {
    let stats = state.engine().stats();
    let (status, word) = if state.is_stopping() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    } else {
        (StatusCode::OK, "ok")
    };
    let body = json!({
        "status": word,
        "model": state.config().model_id,
        "requests_running": stats.requests_running,
        "requests_waiting": stats.requests_waiting,
    });
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = crate::metrics::render(&state.engine().stats(), &state.0.http);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(uri.path().to_string())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
}

/// `Authorization: Bearer <key>` when the server has a key (scheme case-insensitive, as
/// RFC 7235 says); compared in time independent of where the strings differ.
async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config().api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn count_responses(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.0.http.record(response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_by_content_and_length() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
