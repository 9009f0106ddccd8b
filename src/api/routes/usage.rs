//! `GET /usage`: what keys spent, per day, model or key. A key reads its
//! own usage; an admin key reads every key's, each by its configured name.

use axum::extract::State;
use axum::{Extension, Json};
use chrono::{DateTime, NaiveDate};
use serde::Deserialize;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::usage::report::{GroupBy, UsageReport, report};
use crate::usage::{owner_id, today};

/// The longest range one query reads, in days.
const MAX_DAYS: i64 = 366;

/// Read as text and checked here, so that a bad value is a 422 naming
/// its field.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// The first day (UTC), as a date (`2026-11-27`) or an RFC 3339 time
    /// (its UTC day); default today.
    from: Option<String>,
    /// The last day (UTC), included; default today (or `from`, if later).
    to: Option<String>,
    /// `day` (default), `model` or `key`.
    group_by: Option<String>,
}

/// A day given as a date or an RFC 3339 time (its UTC day).
fn day(field: &str, text: &str) -> Result<NaiveDate, ApiError> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .or_else(|_| DateTime::parse_from_rfc3339(text).map(|t| t.to_utc().date_naive()))
        .map_err(|_| {
            ApiError::invalid(
                field,
                format!("{text:?} is neither a date (YYYY-MM-DD) nor an RFC 3339 time"),
            )
        })
}

/// The caller's usage over `from`..=`to`, summed by `group_by`; an admin
/// key's covers every key.
#[utoipa::path(get, path = "/usage", params(UsageQuery),
    responses((status = 200, body = UsageReport, description = "Usage summed by day, model or key"),
        (status = 422, body = ErrorBody, description = "A bad `from`, `to` or `group_by`, named")))]
pub async fn usage(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let from = match &query.from {
        Some(text) => day("from", text)?,
        None => today(),
    };
    let to = match &query.to {
        Some(text) => day("to", text)?,
        None => from.max(today()),
    };
    if to < from {
        return Err(ApiError::invalid(
            "to",
            format!("{to} is before from ({from})"),
        ));
    }
    if (to - from).num_days() >= MAX_DAYS {
        return Err(ApiError::invalid(
            "to",
            format!("a query covers at most {MAX_DAYS} days"),
        ));
    }
    let group_by = match &query.group_by {
        Some(text) => GroupBy::parse(text).ok_or_else(|| {
            ApiError::invalid(
                "group_by",
                format!("{text:?} is not one of key, model, day"),
            )
        })?,
        None => GroupBy::Day,
    };
    // An admin reads every key's rows; any other key only its own.
    let owner = (!caller.admin).then(|| owner_id(caller.owner()));
    // What this replica holds to write behind is counted too.
    state.usage.flush().await;
    let rows = state
        .store
        .usage_rows(from, to, owner)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(report(&rows, state.usage.keys(), from, to, group_by)))
}
