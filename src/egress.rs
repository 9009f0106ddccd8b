//! Where the server may connect on a caller's behalf: gateway replicas added
//! at run time, a session's HTTP MCP servers and its A2A agents. A URL from a request could
//! otherwise point the server at itself, at services on its host or its
//! private network, or at a cloud metadata endpoint.
//!
//! [`Rules`] are the operator's allow list: `public` (any public address),
//! host names, addresses and CIDRs. Loopback, private, link-local and
//! reserved addresses pass only by an explicit entry. A URL is checked when
//! it is given ([`Rules::check_url`], resolving names) and again on every
//! connection by [`Rules::client`]'s resolver, which hands the HTTP client
//! only allowed addresses, so a name that resolves elsewhere later (DNS
//! rebinding) connects nowhere it should not. Redirects are not followed:
//! one to an address literal would skip the resolver.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// One allow entry.
#[derive(Debug, Clone, PartialEq)]
enum Rule {
    /// Any address that is not loopback, private, link-local or reserved.
    Public,
    /// A host name, trusted whatever it resolves to.
    Host(String),
    Net(IpNet),
}

/// An allow list; empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    rules: Vec<Rule>,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("{0:?} is not an http or https URL with a host")]
    BadUrl(String),
    #[error("outbound connections of this kind are turned off (the allow list is empty)")]
    Off,
    #[error("{host} resolves to {addr}, a {kind} address, which the allow list does not include")]
    Refused {
        host: String,
        addr: IpAddr,
        kind: &'static str,
    },
    #[error("{host} does not resolve: {message}")]
    Unresolved { host: String, message: String },
}

impl Rules {
    /// Reads entries; the error names the entry that is none of the kinds.
    pub fn parse(entries: &[String]) -> Result<Rules, String> {
        let rules = entries
            .iter()
            .map(|entry| {
                let text = entry.trim();
                if text.eq_ignore_ascii_case("public") {
                    Ok(Rule::Public)
                } else if let Ok(net) = text.parse::<IpNet>() {
                    Ok(Rule::Net(net.trunc()))
                } else if let Ok(addr) = text.parse::<IpAddr>() {
                    Ok(Rule::Net(IpNet::from(addr)))
                } else if is_host_name(text.trim_end_matches('.')) {
                    Ok(Rule::Host(normal_name(text)))
                } else {
                    Err(format!(
                        "{entry:?} is not \"public\", a host name, an address or a CIDR"
                    ))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Rules { rules })
    }

    fn allows_name(&self, host: &str) -> bool {
        let host = normal_name(host);
        self.rules
            .iter()
            .any(|r| matches!(r, Rule::Host(h) if *h == host))
    }

    /// Whether a connection to `addr` is allowed, or the kind of address
    /// that it is and that no entry allows.
    fn allows_addr(&self, addr: IpAddr) -> Result<(), &'static str> {
        let addr = canonical(addr);
        let kind = kind_of(addr);
        let allowed = self.rules.iter().any(|rule| match rule {
            Rule::Public => kind == "public",
            Rule::Net(net) => net.contains(&addr),
            Rule::Host(_) => false,
        });
        if allowed { Ok(()) } else { Err(kind) }
    }

    /// Checks a URL given in a request: its scheme, and every address its
    /// host resolves to now.
    pub async fn check_url(&self, url: &str) -> Result<(), EgressError> {
        let bad = || EgressError::BadUrl(url.to_string());
        let parsed = reqwest::Url::parse(url).map_err(|_| bad())?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad());
        }
        if self.rules.is_empty() {
            return Err(EgressError::Off);
        }
        let port = parsed.port_or_known_default().unwrap_or(80);
        let addrs: Vec<IpAddr> = match parsed.host().ok_or_else(bad)? {
            url::Host::Ipv4(addr) => vec![IpAddr::V4(addr)],
            url::Host::Ipv6(addr) => vec![IpAddr::V6(addr)],
            url::Host::Domain(name) if self.allows_name(name) => return Ok(()),
            url::Host::Domain(name) => resolve(name, port).await?,
        };
        let host = parsed.host_str().unwrap_or_default();
        for addr in addrs {
            self.allows_addr(addr)
                .map_err(|kind| EgressError::Refused {
                    host: host.to_string(),
                    addr,
                    kind,
                })?;
        }
        Ok(())
    }

    /// As [`Rules::check_url`], for a client other than the server's own
    /// (git): the URL's host name, port and the allowed addresses it
    /// resolves to now, for that client to connect to and nowhere else.
    /// `None` for a URL whose host is an address.
    pub async fn pinned(
        &self,
        url: &str,
    ) -> Result<Option<(String, u16, Vec<IpAddr>)>, EgressError> {
        self.check_url(url).await?;
        let parsed = reqwest::Url::parse(url).map_err(|_| EgressError::BadUrl(url.into()))?;
        let Some(url::Host::Domain(name)) = parsed.host() else {
            return Ok(None);
        };
        let port = parsed.port_or_known_default().unwrap_or(80);
        let allowed = Guarded(Arc::new(self.clone()))
            .allowed(name.to_string())
            .await?;
        let addrs = allowed.into_iter().map(|a| a.ip()).collect();
        Ok(Some((name.to_string(), port, addrs)))
    }

    /// An HTTP client builder that connects only where these rules allow
    /// and follows no redirect.
    pub fn client(self: &Arc<Self>) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .dns_resolver(Arc::new(Guarded(self.clone())))
            .redirect(reqwest::redirect::Policy::none())
    }
}

/// The resolver of [`Rules::client`] and of the gateway's hyper client
/// (as a `tower::Service<Name>`): only allowed addresses reach the
/// connector.
#[derive(Clone)]
pub struct Guarded(pub Arc<Rules>);

impl Guarded {
    /// The addresses of `host` these rules allow (port 0: the connector
    /// sets the URL's).
    async fn allowed(self, host: String) -> Result<Vec<SocketAddr>, EgressError> {
        let rules = self.0;
        let addrs = resolve(&host, 0).await?;
        let trusted = rules.allows_name(&host);
        let mut refused = None;
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| {
                trusted
                    || rules
                        .allows_addr(*addr)
                        .map_err(|kind| refused = Some((*addr, kind)))
                        .is_ok()
            })
            .map(|addr| SocketAddr::new(addr, 0))
            .collect();
        if allowed.is_empty() {
            let (addr, kind) = refused.unwrap_or((IpAddr::V4(Ipv4Addr::UNSPECIFIED), "unknown"));
            return Err(EgressError::Refused { host, addr, kind });
        }
        Ok(allowed)
    }
}

impl Resolve for Guarded {
    fn resolve(&self, name: Name) -> Resolving {
        let allowed = self.clone().allowed(name.as_str().to_string());
        Box::pin(async move {
            let allowed = allowed.await.map_err(Box::new)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for Guarded {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = EgressError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, EgressError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), EgressError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let allowed = self.clone().allowed(name.as_str().to_string());
        Box::pin(async move { Ok(allowed.await?.into_iter()) })
    }
}

async fn resolve(host: &str, port: u16) -> Result<Vec<IpAddr>, EgressError> {
    let unresolved = |message: String| EgressError::Unresolved {
        host: host.to_string(),
        message,
    };
    let addrs: Vec<IpAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| unresolved(e.to_string()))?
        .map(|a| a.ip())
        .collect();
    if addrs.is_empty() {
        return Err(unresolved("no addresses".into()));
    }
    Ok(addrs)
}

fn normal_name(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `text` (a trailing dot aside) is a DNS host name.
pub fn is_host_name(text: &str) -> bool {
    let text = text.trim_end_matches('.');
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// An IPv4 address carried in IPv6 (mapped or NAT64) counts as itself.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Every address range that is not the public internet, and its kind; the
/// first range holding an address names it. Besides the checks here, the
/// sandbox firewall rejects every one of them, so what the server may not
/// reach for a caller and what a sandbox may not reach are this one list.
pub const NOT_PUBLIC: &[(&str, &str)] = &[
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "private"),
    ("fc00::/7", "private"),
    // 169.254.169.254 is the cloud metadata service.
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("0.0.0.0/8", "reserved"),
    ("192.0.0.0/24", "reserved"),
    // The three documentation ranges: some networks use them as LANs.
    ("192.0.2.0/24", "reserved"),
    ("198.51.100.0/24", "reserved"),
    ("203.0.113.0/24", "reserved"),
    ("198.18.0.0/15", "reserved"),
    // Multicast, then the old class E with the broadcast address.
    ("224.0.0.0/4", "reserved"),
    ("240.0.0.0/4", "reserved"),
    // The unspecified address and the IPv4-compatible ones.
    ("::/96", "reserved"),
    // Mapped and NAT64 addresses and 6to4 carry IPv4 addresses that could
    // be anything (the checks here judge a mapped one by its IPv4 address).
    ("::ffff:0:0/96", "reserved"),
    ("64:ff9b::/96", "reserved"),
    ("2002::/16", "reserved"),
    ("2001:db8::/32", "reserved"),
    ("fec0::/10", "reserved"),
    ("ff00::/8", "reserved"),
];

/// What kind of address this is: `public`, or why it is not (an IPv4
/// address carried in IPv6 counts as itself).
pub fn kind_of(addr: IpAddr) -> &'static str {
    let addr = canonical(addr);
    NOT_PUBLIC
        .iter()
        .find(|(net, _)| net.parse::<IpNet>().is_ok_and(|net| net.contains(&addr)))
        .map_or("public", |(_, kind)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(entries: &[&str]) -> Rules {
        Rules::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn addresses_are_classified() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "reserved"),
            ("255.255.255.255", "reserved"),
            ("224.0.0.1", "reserved"),
            ("192.0.2.2", "reserved"),
            ("198.51.100.7", "reserved"),
            ("203.0.113.9", "reserved"),
            ("::", "reserved"),
            ("ff02::1", "reserved"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("fd00::1", "private"),
            ("fe80::1", "link-local"),
            ("64:ff9b::a00:1", "reserved"),
            ("8.8.8.8", "public"),
            ("2606:4700::1111", "public"),
        ] {
            assert_eq!(kind_of(canonical(addr.parse().unwrap())), kind, "{addr}");
        }
    }

    #[test]
    fn entries_allow_what_they_name() {
        let r = rules(&["public", "10.0.0.0/8", "127.0.0.1", "Inference.Internal."]);
        assert!(r.allows_addr("8.8.8.8".parse().unwrap()).is_ok());
        assert!(r.allows_addr("10.9.9.9".parse().unwrap()).is_ok());
        assert!(r.allows_addr("::ffff:127.0.0.1".parse().unwrap()).is_ok());
        assert_eq!(r.allows_addr("127.0.0.2".parse().unwrap()), Err("loopback"));
        assert_eq!(
            r.allows_addr("192.168.0.1".parse().unwrap()),
            Err("private")
        );
        assert!(r.allows_name("inference.internal"));
        let private_only = rules(&["10.0.0.0/8"]);
        assert_eq!(
            private_only.allows_addr("8.8.8.8".parse().unwrap()),
            Err("public")
        );
        let err = Rules::parse(&["http://x".into()]).unwrap_err();
        assert!(err.contains("\"http://x\""), "{err}");
    }

    #[tokio::test]
    async fn urls_are_checked_after_resolution() {
        let public = rules(&["public"]);
        let err = public
            .check_url("http://localhost:8080/v1")
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                EgressError::Refused {
                    kind: "loopback",
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            public.check_url("http://[::ffff:10.0.0.1]/").await,
            Err(EgressError::Refused {
                kind: "private",
                ..
            })
        ));
        assert!(matches!(
            public.check_url("file:///etc/passwd").await,
            Err(EgressError::BadUrl(_))
        ));
        assert!(matches!(
            Rules::default().check_url("http://8.8.8.8/").await,
            Err(EgressError::Off)
        ));
        assert!(
            rules(&["localhost"])
                .check_url("http://localhost/")
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn the_client_refuses_a_name_that_resolves_to_a_refused_address() {
        // What a rebinding name does at connection time: the resolver, not
        // the earlier check, decides.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = Arc::new(rules(&["public"])).client().build().unwrap();
        let err = client
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        let chain = format!("{:?}", err);
        assert!(chain.contains("loopback"), "{chain}");
        let allowed = Arc::new(rules(&["127.0.0.0/8", "::1"]))
            .client()
            .build()
            .unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        });
        let answer = allowed
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
}
