//! The load's HTTP client: one HTTP/1.1 keep-alive connection per client, on hyper's
//! connection API. The clients share the machine's cores with the service, so what they
//! cost and where they queue shows up in every figure: a connection per client has no pool
//! to look up or lock between thousands of clients, and each request is a write and a read on
//! the client's own socket.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One client's connection to `http://host:port`; opened again after the service closed it.
pub struct Connection {
    /// `host:port`.
    authority: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// What the load looks at in an answer.
pub struct Answer {
    pub status: u16,
    /// `Retry-After` in seconds, when present and a number.
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

impl Connection {
    /// A connection to `base` (`http://host:port`, plain HTTP), opened on first use.
    pub fn to(base: &str) -> Connection {
        let authority = base
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("the load speaks plain HTTP; {base} is not http://"))
            .trim_end_matches('/')
            .to_owned();
        Connection {
            authority,
            sender: None,
        }
    }

    pub async fn get(&mut self, path: &str) -> Result<Answer, String> {
        self.send(Method::GET, path, None).await
    }

    pub async fn post_json(&mut self, path: &str, body: Vec<u8>) -> Result<Answer, String> {
        self.send(Method::POST, path, Some(body)).await
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority);
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let sender = self.ready().await?;
        let answered = sender.send_request(request).await;
        let response = match answered {
            Ok(response) => response,
            Err(error) => {
                self.sender = None;
                return Err(format!("{path}: {error}"));
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = match response.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                self.sender = None;
                return Err(format!("{path}: reading the answer: {error}"));
            }
        };
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }

    /// The connection, opened if there is none or the last one closed, ready for a request.
    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = Some(self.open().await?);
        }
        let sender = self.sender.as_mut().expect("just opened");
        if let Err(error) = sender.ready().await {
            self.sender = None;
            return Err(format!("connection to {}: {error}", self.authority));
        }
        Ok(self.sender.as_mut().expect("ready"))
    }

    async fn open(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {}: {e}", self.authority))?;
        // The connection's I/O runs as a task of its own and ends when `sender` is dropped.
        tokio::spawn(connection);
        Ok(sender)
    }
}
