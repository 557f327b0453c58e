//! `deltaq serve` over loopback for the API tests: the built binary on an ephemeral port with the demo
//! model, a real HTTP client (ureq), and raw HTTP over a TCP stream for malformed requests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/tiny-kjv-mtp-Q8_0.gguf");
pub const MODEL_ID: &str = "tiny-kjv-mtp-Q8_0";

pub struct Server {
    child: Child,
    pub base: String,
    pub addr: String,
    agent: ureq::Agent,
}

/// A response: status, content type and body text.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} (status {})", self.text, self.status))
    }

    /// The body as newline-delimited JSON.
    pub fn lines(&self) -> Vec<Value> {
        self.text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let mut args = vec!["-m", MODEL];
        args.extend_from_slice(extra);
        let (child, addr, agent) = spawn_serve(&args);
        Server {
            child,
            base: format!("http://{addr}"),
            addr,
            agent,
        }
    }

    fn reply(mut r: ureq::http::Response<ureq::Body>) -> Reply {
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = r.body_mut().read_to_string().unwrap();
        Reply {
            status,
            content_type,
            text,
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        Self::reply(
            self.agent
                .get(&format!("{}{path}", self.base))
                .call()
                .unwrap(),
        )
    }

    pub fn post_text(&self, path: &str, body: &str) -> Reply {
        Self::reply(
            self.agent
                .post(&format!("{}{path}", self.base))
                .header("Content-Type", "application/json")
                .send(body)
                .unwrap(),
        )
    }

    /// A GET with `Authorization: Bearer KEY`.
    pub fn get_with_key(&self, path: &str, key: &str) -> Reply {
        Self::reply(
            self.agent
                .get(&format!("{}{path}", self.base))
                .header("Authorization", &format!("Bearer {key}"))
                .call()
                .unwrap(),
        )
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_text(path, &body.to_string())
    }

    pub fn health(&self) -> Value {
        self.get("/health").json()
    }

    /// Sends bytes over a fresh connection and returns the status code and body of the response.
    pub fn raw(&self, bytes: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }
}

/// Starts `deltaq serve --port 0 -t 1 ARGS` and waits (up to a minute) for the address it prints:
/// the process, the address (`host:port`) and an HTTP agent that returns error statuses as responses.
pub fn spawn_serve(args: &[&str]) -> (Child, String, ureq::Agent) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltaq"))
        .args(["serve", "--port", "0", "-t", "1"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting deltaq serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(i) = line.find("http://") {
                    let addr = line[i + 7..].split_whitespace().next().unwrap().to_string();
                    let _ = tx.send(addr);
                    sent = true;
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server did not print its address");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    (child, addr, agent)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
