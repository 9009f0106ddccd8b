//! A TCP forwarder between a server under test and a part it needs
//! (PostgreSQL), which a test can cut and mend: cut, it drops every open
//! connection and each new one at once, as a database that went down
//! would; mended, it forwards again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct Proxy {
    pub port: u16,
    open: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    /// Forwards 127.0.0.1:`port` to `target` (`host:port`).
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let links: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, links) = (open.clone(), links.clone());
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        return;
                    };
                    if !open.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let target = target.clone();
                    let link = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(&target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    links.lock().unwrap().push(link.abort_handle());
                }
            }
        })
        .abort_handle();
        Proxy {
            port,
            open,
            links,
            accept,
        }
    }

    /// Drops every connection and refuses new ones until [`Proxy::mend`].
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    pub fn mend(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
