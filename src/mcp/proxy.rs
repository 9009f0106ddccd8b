//! `conclave mcp` in front of a running server: the stdio client's requests
//! go to the server's `/mcp` with the caller's key, so an IDE that starts its
//! MCP servers as commands reaches the live sessions (`run_agent`, the
//! session resources) that only the serving process can run.
//!
//! The server decides everything: the tools and resources listed are its,
//! and its key check decides which sessions exist for this client. The
//! proxy only relays: a call's progress under the stdio client's own
//! progress token, the client's `notifications/cancelled` as a cancellation
//! of the upstream request, and the server's resource notifications.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam,
    ClientRequest, ErrorData, Implementation, JsonRpcMessage, JsonRpcNotification,
    ListResourceTemplatesRequest, ListResourceTemplatesResult, ListResourcesRequest,
    ListResourcesResult, ListToolsRequest, ListToolsResult, PaginatedRequestParams,
    ProgressNotification, ProgressToken, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResponse, ResourceUpdatedNotificationParam, ResultType, ServerConfig,
    ServerNotification, ServerResult, SubscribeRequestParams, UnsubscribeRequestParams,
};
// IDEs speak the 2025 protocol, whose subscriptions these are.
#[allow(deprecated)]
use rmcp::model::{SubscribeRequest, UnsubscribeRequest};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, RequestContext, RxJsonRpcMessage, ServiceError,
    TxJsonRpcMessage,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, Peer, RoleClient, RoleServer, ServerHandler, ServiceExt};

use crate::sync::lock;

/// The server's side of the proxy: relays what the server sends unasked.
#[derive(Clone, Default)]
struct Relay {
    /// The stdio client, once it is connected.
    downstream: Arc<OnceLock<Peer<RoleServer>>>,
    /// An upstream call's progress token → the stdio client's token for
    /// the same call; calls whose client asked for no progress are absent.
    progress: Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>,
    /// Progress that came before its call's route was set: the server may
    /// send a call's first progress before `forward` knows the call's
    /// token. Held (at most [`EARLY_PROGRESS`]) until the route is set.
    early: Arc<Mutex<VecDeque<ProgressNotification>>>,
    /// Held while a progress notification is routed and sent, so that held
    /// and new ones reach the client in the order the server sent them.
    sending: Arc<tokio::sync::Mutex<()>>,
}

/// Progress notifications held for calls whose route is not set yet.
const EARLY_PROGRESS: usize = 256;

/// Forgets a call's progress route when the call ends, however it ends.
struct ProgressRoute {
    relay: Relay,
    upstream: ProgressToken,
}

impl Drop for ProgressRoute {
    fn drop(&mut self) {
        lock(&self.relay.progress).remove(&self.upstream);
    }
}

impl Relay {
    async fn send_progress(&self, mut notification: ProgressNotification, token: ProgressToken) {
        notification.params.progress_token = token;
        if let Some(client) = self.downstream.get() {
            let _ = client
                .send_notification(ServerNotification::ProgressNotification(notification))
                .await;
        }
    }

    /// Routes a call's progress to the stdio client's `token` from now on,
    /// sending first what came for it before.
    async fn route(&self, upstream: ProgressToken, token: ProgressToken) -> ProgressRoute {
        let _sending = self.sending.lock().await;
        lock(&self.progress).insert(upstream.clone(), token.clone());
        let held: Vec<ProgressNotification> = {
            let mut early = lock(&self.early);
            let (held, rest): (Vec<_>, Vec<_>) = early
                .drain(..)
                .partition(|n| n.params.progress_token == upstream);
            early.extend(rest);
            held
        };
        for notification in held {
            self.send_progress(notification, token.clone()).await;
        }
        ProgressRoute {
            relay: self.clone(),
            upstream,
        }
    }
}

impl Relay {
    /// Relays one progress notification under its call's stdio token, or
    /// holds it until the call's route is set.
    async fn progress(&self, notification: ProgressNotification) {
        let _sending = self.sending.lock().await;
        let route = lock(&self.progress)
            .get(&notification.params.progress_token)
            .cloned();
        match route {
            Some(token) => self.send_progress(notification, token).await,
            None => {
                let mut early = lock(&self.early);
                if early.len() >= EARLY_PROGRESS {
                    early.pop_front();
                }
                early.push_back(notification);
            }
        }
    }
}

/// The upstream transport, relaying progress as it is read. rmcp hands
/// each notification to a task of its own while a response goes straight
/// to its caller, so a call's last progress could otherwise reach the stdio
/// client after the call's result (or, its route gone, not at all).
struct InOrder<T> {
    inner: T,
    relay: Relay,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for InOrder<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            match message {
                JsonRpcMessage::Notification(JsonRpcNotification {
                    notification: ServerNotification::ProgressNotification(progress),
                    ..
                }) => self.relay.progress(progress).await,
                other => return Some(other),
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl ClientHandler for Relay {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Some(client) = self.downstream.get() {
            let _ = client.notify_resource_updated(params).await;
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(client) = self.downstream.get() {
            let _ = client.notify_resource_list_changed().await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(client) = self.downstream.get() {
            let _ = client.notify_tool_list_changed().await;
        }
    }
}

/// The stdio client's side: every request is the server's to answer.
#[derive(Clone)]
struct Proxy {
    upstream: Peer<RoleClient>,
    relay: Relay,
    /// What the server said of itself, told to the stdio client as is.
    info: ServerConfig,
}

/// The server's own error (a wrong session, a bad argument) reaches the
/// client unchanged; a lost connection to it is the proxy's.
fn upstream_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("the conclave server: {other}"), None),
    }
}

fn unexpected() -> ErrorData {
    ErrorData::internal_error(
        "the conclave server answered with another kind of result",
        None,
    )
}

/// Marks a result relayed from the server (whose session with the proxy
/// is of the 2025 revisions, without the field) as complete, as a stdio
/// client of 2026-07-28 requires; rmcp leaves it out for older clients.
fn complete(result_type: &mut Option<ResultType>) {
    result_type.get_or_insert(ResultType::COMPLETE);
}

impl Proxy {
    /// Sends one request upstream and waits for its answer, relaying its
    /// progress and cancelling it upstream if the stdio client cancels.
    async fn forward(
        &self,
        request: ClientRequest,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let handle = self
            .upstream
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .map_err(upstream_error)?;
        let _route = match ctx.meta.get_progress_token() {
            Some(token) => Some(self.relay.route(handle.progress_token.clone(), token).await),
            None => None,
        };
        let (id, upstream) = (handle.id.clone(), handle.peer.clone());
        tokio::select! {
            response = handle.await_response() => response.map_err(upstream_error),
            () = ctx.ct.cancelled() => {
                let reason = Some("cancelled by the stdio client".to_string());
                let _ = upstream
                    .notify_cancelled(CancelledNotificationParam::new(Some(id), reason))
                    .await;
                Err(ErrorData::internal_error("cancelled", None))
            }
        }
    }
}

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    /// As the server relayed to: no prompts.
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Err(super::no_prompts())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let request = ListToolsRequest::with_param(request.unwrap_or_default());
        match self.forward(request.into(), &ctx).await? {
            ServerResult::ListToolsResult(mut result) => {
                complete(&mut result.result_type);
                Ok(result)
            }
            _ => Err(unexpected()),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match self
            .forward(CallToolRequest::new(request).into(), &ctx)
            .await?
        {
            ServerResult::CallToolResult(mut result) => {
                complete(&mut result.result_type);
                Ok(CallToolResponse::Complete(result))
            }
            _ => Err(unexpected()),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let request = ListResourcesRequest::with_param(request.unwrap_or_default());
        match self.forward(request.into(), &ctx).await? {
            ServerResult::ListResourcesResult(mut result) => {
                complete(&mut result.result_type);
                Ok(result)
            }
            _ => Err(unexpected()),
        }
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let request = ListResourceTemplatesRequest::with_param(request.unwrap_or_default());
        match self.forward(request.into(), &ctx).await? {
            ServerResult::ListResourceTemplatesResult(mut result) => {
                complete(&mut result.result_type);
                Ok(result)
            }
            _ => Err(unexpected()),
        }
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match self
            .forward(ReadResourceRequest::new(request).into(), &ctx)
            .await?
        {
            ServerResult::ReadResourceResult(mut result) => {
                complete(&mut result.result_type);
                Ok(ReadResourceResponse::Complete(result))
            }
            _ => Err(unexpected()),
        }
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.forward(SubscribeRequest::new(request).into(), &ctx)
            .await
            .map(drop)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.forward(UnsubscribeRequest::new(request).into(), &ctx)
            .await
            .map(drop)
    }
}

/// Serves stdin/stdout as the server at `server` (its base URL) with
/// `api_key`, until the stdio client closes them.
pub async fn serve_stdio(server: &str, api_key: Option<String>) -> anyhow::Result<()> {
    let endpoint = format!("{}/mcp", server.trim_end_matches('/'));
    let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint.as_str());
    if let Some(key) = api_key {
        config = config.auth_header(key);
    }
    let relay = Relay::default();
    let transport = InOrder {
        inner: StreamableHttpClientTransport::from_config(config),
        relay: relay.clone(),
    };
    let upstream = relay
        .clone()
        .serve(transport)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open an MCP session at {endpoint}: {e}"))?;
    let server_info = upstream
        .peer_info()
        .ok_or_else(|| anyhow::anyhow!("{endpoint} did not describe itself"))?;
    let info = ServerConfig::new(server_info.capabilities.clone())
        .with_server_info(
            server_info
                .server_info
                .clone()
                .unwrap_or_else(|| Implementation::new("conclave", env!("CARGO_PKG_VERSION"))),
        )
        .with_instructions(server_info.instructions.clone().unwrap_or_default());
    tracing::info!(%endpoint, "conclave mcp: relaying stdio to the server");
    let proxy = Proxy {
        upstream: upstream.peer().clone(),
        relay: relay.clone(),
        info,
    };
    let running = proxy.serve(rmcp::transport::stdio()).await?;
    let _ = relay.downstream.set(running.peer().clone());
    let ended = running.waiting().await;
    let _ = upstream.cancel().await;
    ended?;
    Ok(())
}
