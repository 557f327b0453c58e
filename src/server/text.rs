//! Text handling of generated output: stop strings across token boundaries, the split into reasoning
//! and content, and the model's `<tool_call>` blocks parsed into OpenAI tool calls.

use serde_json::{json, Map, Value};

use crate::chat::{Part, ThinkStream};

/// The longest `k < s.len()` (on a char boundary of `s`) such that `text` ends with `s[..k]`.
fn partial_suffix(text: &str, s: &str) -> usize {
    s.char_indices()
        .map(|(i, _)| i)
        .filter(|&k| k > 0 && text.ends_with(&s[..k]))
        .max()
        .unwrap_or(0)
}

/// Finds stop strings in streamed text. Text that could be the start of a stop string is held back
/// until it is certain either way.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    buf: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            buf: String::new(),
        }
    }

    /// Adds text; returns the text that is certain now, and whether a stop string was found (the
    /// text up to it is returned and the rest is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.buf.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.buf), false);
        }
        if let Some(pos) = self.stops.iter().filter_map(|s| self.buf.find(s)).min() {
            let out = self.buf[..pos].to_string();
            self.buf.clear();
            return (out, true);
        }
        let keep = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.buf, s))
            .max()
            .unwrap_or(0);
        let cut = self.buf.len() - keep;
        let out = self.buf[..cut].to_string();
        self.buf.drain(..cut);
        (out, false)
    }

    /// The text held back at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.buf)
    }
}

/// A piece of a chat answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
}

/// A parsed tool call: the function's name and its arguments as a JSON object string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// Splits streamed chat output into reasoning and content; with tools, everything from the first
/// `<tool_call>` of the content on is kept back and parsed at the end.
#[derive(Clone, Debug)]
pub struct ChatStream {
    think: ThinkStream,
    tools: bool,
    pending: String,
    tool_buf: Option<String>,
}

impl ChatStream {
    /// `started_in_think`: the prompt ends inside `<think>` (thinking on). `tools`: look for tool calls.
    pub fn new(started_in_think: bool, tools: bool) -> ChatStream {
        ChatStream {
            think: ThinkStream::new(started_in_think),
            tools,
            pending: String::new(),
            tool_buf: None,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let parts = self.think.push(text);
        self.route(parts)
    }

    fn route(&mut self, parts: Vec<(Part, String)>) -> Vec<Delta> {
        let mut out = Vec::new();
        for (part, text) in parts {
            match part {
                Part::Thinking => out.push(Delta::Reasoning(text)),
                Part::Answer => self.answer(&text, &mut out),
            }
        }
        out
    }

    fn answer(&mut self, text: &str, out: &mut Vec<Delta>) {
        if let Some(buf) = &mut self.tool_buf {
            buf.push_str(text);
            return;
        }
        if !self.tools {
            out.push(Delta::Content(text.to_string()));
            return;
        }
        self.pending.push_str(text);
        if let Some(pos) = self.pending.find(TOOL_OPEN) {
            let before = self.pending[..pos].to_string();
            if !before.is_empty() {
                out.push(Delta::Content(before));
            }
            self.tool_buf = Some(self.pending[pos..].to_string());
            self.pending.clear();
            return;
        }
        let keep = partial_suffix(&self.pending, TOOL_OPEN);
        let cut = self.pending.len() - keep;
        if cut > 0 {
            out.push(Delta::Content(self.pending[..cut].to_string()));
            self.pending.drain(..cut);
        }
    }

    /// Ends the stream: the held-back text, and the tool calls found (if none could be parsed, the
    /// held-back tool text is returned as content).
    pub fn finish(&mut self) -> (Vec<Delta>, Vec<ToolCall>) {
        let parts = self.think.finish();
        let mut out = self.route(parts);
        if !self.pending.is_empty() {
            out.push(Delta::Content(std::mem::take(&mut self.pending)));
        }
        let mut calls = Vec::new();
        if let Some(buf) = self.tool_buf.take() {
            calls = parse_tool_calls(&buf);
            if calls.is_empty() {
                out.push(Delta::Content(buf));
            }
        }
        (out, calls)
    }
}

/// Parses Qwen3.5's XML tool calls (`<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
/// </function>\n</tool_call>`), and the JSON form of earlier Qwen models (`<tool_call>\n{"name": …,
/// "arguments": {…}}\n</tool_call>`). A parameter value that is valid JSON (number, object, …) is kept
/// as such, anything else is a string. Unparsable blocks are skipped.
pub fn parse_tool_calls(text: &str) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(TOOL_OPEN) {
        let body_start = start + TOOL_OPEN.len();
        let (body, next) = match rest[body_start..].find(TOOL_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + TOOL_CLOSE.len()..],
            ),
            // Generation stopped before the close tag: parse what is there.
            None => (&rest[body_start..], ""),
        };
        if let Some(call) = parse_one(body.trim()) {
            calls.push(call);
        }
        rest = next;
    }
    calls
}

fn parse_one(body: &str) -> Option<ToolCall> {
    if body.starts_with('{') {
        let v: Value = serde_json::from_str(body).ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let args = match v.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(a) => a.to_string(),
            None => "{}".to_string(),
        };
        return Some(ToolCall {
            name,
            arguments: args,
        });
    }
    let f = body.strip_prefix("<function=")?;
    let name_end = f.find('>')?;
    let name = f[..name_end].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut args = Map::new();
    let mut rest = &f[name_end + 1..];
    while let Some(p) = rest.find("<parameter=") {
        let after = &rest[p + "<parameter=".len()..];
        let Some(key_end) = after.find('>') else {
            break;
        };
        let key = after[..key_end].trim().to_string();
        let value_start = &after[key_end + 1..];
        let (raw, next) = match value_start.find("</parameter>") {
            Some(e) => (&value_start[..e], &value_start[e + "</parameter>".len()..]),
            None => match value_start.find("</function>") {
                Some(e) => (&value_start[..e], &value_start[e..]),
                None => (value_start, ""),
            },
        };
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !v.is_string() => v,
            _ => Value::String(raw.to_string()),
        };
        args.insert(key, value);
        rest = next;
    }
    Some(ToolCall {
        name,
        arguments: Value::Object(args).to_string(),
    })
}

/// A tool call in the API's shape.
pub fn tool_call_json(call: &ToolCall, index: usize, id: &str) -> Value {
    json!({
        "index": index,
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_pieces() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "Dxyz"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".into(), false)
        );
        assert_eq!(run(&["b", "xyz"], &["axy", "b"]), ("axy".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["aé", "!b"]), ("a".into(), true));
    }

    #[test]
    fn stop_holds_back_only_prefixes() {
        let mut m = StopMatcher::new(vec!["\n\n".into()]);
        assert_eq!(m.push("line\n"), ("line".into(), false));
        assert_eq!(m.push("more"), ("\nmore".into(), false));
    }

    #[test]
    fn tool_calls_xml_and_json() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let calls = parse_tool_calls(text);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3}));
        assert_eq!(calls[1].name, "f");
        assert_eq!(calls[1].arguments, "{\"a\":1}");
        assert!(parse_tool_calls("<tool_call>garbage</tool_call>").is_empty());
    }

    #[test]
    fn chat_stream_splits_reasoning_content_tools() {
        let mut s = ChatStream::new(true, true);
        let mut got = Vec::new();
        for p in [
            "hm\n</th",
            "ink>\n\nSure. <tool",
            "_call>\n<function=f>\n</function>\n</tool_call>",
        ] {
            got.extend(s.push(p));
        }
        let (rest, calls) = s.finish();
        got.extend(rest);
        let reasoning: String = got
            .iter()
            .filter_map(|d| match d {
                Delta::Reasoning(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let content: String = got
            .iter()
            .filter_map(|d| match d {
                Delta::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning.trim(), "hm");
        assert_eq!(content, "Sure. ");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, "{}");
    }
}
