//! NDJSON lines off a streamed response, shared by the benchmarks.
#![allow(dead_code)]

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;

pub struct Lines {
    stream: BoxStream<'static, reqwest::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl Lines {
    pub fn new(response: reqwest::Response) -> Lines {
        Lines {
            stream: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next JSON line; an error says why there is none.
    pub async fn next(&mut self) -> Result<Value, String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line)
                    .map_err(|e| format!("a streamed line is not JSON: {e}"));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(format!("the stream broke: {e}")),
                None => return Err("the stream ended".into()),
            }
        }
    }
}
