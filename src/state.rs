//! The application state every handler shares.

use std::sync::Arc;
use std::time::Instant;

use crate::agent::SessionManager;
use crate::api::auth::Keys;
use crate::config::Config;
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub sessions: Arc<SessionManager>,
    pub metrics: Arc<Metrics>,
    pub keys: Arc<Keys>,
    pub started: Instant,
}
