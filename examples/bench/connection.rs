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

/// How long one request may take, connecting included, before it counts as failed (the
/// connection is then dropped): a stalled service ends the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

impl Connection {
    /// A connection to `base` (`http://host:port`, plain HTTP, no path), opened on first use.
    pub fn to(base: &str) -> Result<Connection, String> {
        let rest = base
            .strip_prefix("http://")
            .ok_or_else(|| format!("the load speaks plain HTTP: {base} is not http://host:port"))?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("{base}: expected http://host:port, without a path"));
        }
        let authority = match authority.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok() => authority.to_owned(),
            _ => format!("{authority}:80"),
        };
        Ok(Connection {
            authority,
            sender: None,
        })
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
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                self.sender = None;
                Err(format!("{path}: {error}"))
            }
            Err(_) => {
                self.sender = None;
                Err(format!("{path}: no answer within {REQUEST_TIMEOUT:?}"))
            }
        }
    }

    /// Sends `request` and reads the whole answer. A request the connection never took (the
    /// service had closed it while it sat idle) goes once more, on a new connection.
    async fn exchange(&mut self, request: Request<Full<Bytes>>) -> Result<Answer, String> {
        let response = match self.ready().await?.try_send_request(request).await {
            Ok(response) => response,
            Err(mut error) => match error.take_message() {
                Some(unsent) => {
                    self.sender = None;
                    self.ready()
                        .await?
                        .send_request(unsent)
                        .await
                        .map_err(|e| e.to_string())?
                }
                None => return Err(error.into_error().to_string()),
            },
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok(Answer {
            status,
            retry_after,
            body,
        })
    }

    /// The connection, ready for a request: opened if there is none or the last one closed,
    /// and opened again if the one there turns out to be closed.
    async fn ready(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        for _ in 0..2 {
            if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
                self.sender = Some(self.open().await?);
            }
            let sender = self.sender.as_mut().expect("just opened");
            if sender.ready().await.is_ok() {
                return Ok(self.sender.as_mut().expect("ready"));
            }
            self.sender = None;
        }
        Err(format!("connection to {} closed at once", self.authority))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_is_plain_http_with_a_host_and_a_port_or_80() {
        let authority = |base: &str| Connection::to(base).map(|c| c.authority);
        assert_eq!(
            authority("http://127.0.0.1:8080/").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(authority("http://localhost").unwrap(), "localhost:80");
        assert!(authority("https://localhost:8443").is_err());
        assert!(authority("http://localhost:8080/api").is_err());
        assert!(authority("http://").is_err());
    }
}
