//! Strict tool calls: a grammar for Qwen's `<tool_call>` blocks whose arguments follow the called
//! function's parameter schema. The calls take the JSON form the server's tool-call parser reads
//! (`<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`), since JSON arguments can be held
//! to a schema exactly; the XML form's untyped values cannot.

use serde_json::Value;

/// A function the model may call, with the JSON schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Value,
}

/// Which answers the tool-call grammar allows.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCalls {
    pub tools: Vec<ToolSpec>,
    /// Only tool calls (`tool_choice: "required"` or a named function); otherwise text, optionally
    /// followed by calls.
    pub required: bool,
}

/// The Lark grammar of `calls`. `special_tags`: the vocabulary has `<tool_call>` and `</tool_call>`
/// as tokens (the model writes them so); otherwise they are spelled as text.
pub(super) fn lark(calls: &ToolCalls, special_tags: bool) -> String {
    let (open, close) = if special_tags {
        ("<tool_call>", "</tool_call>")
    } else {
        (r#""<tool_call>""#, r#""</tool_call>""#)
    };
    let mut g = String::new();
    if calls.required {
        g.push_str("start: calls\n");
    } else if special_tags {
        // Text cannot produce the `<tool_call>` token: it ends where a call starts.
        g.push_str("start: TEXT | TEXT? calls\nTEXT: /(?s:.+)/\n");
    } else {
        g.push_str("start: TEXT | TEXT? calls\nTEXT: /(?s:[^<]+)/\n");
    }
    g.push_str("calls: call (\"\\n\" call)*\n");
    let names: Vec<String> = (0..calls.tools.len()).map(|i| format!("fn{i}")).collect();
    g.push_str(&format!(
        "call: {open} \"\\n\" ({}) \"\\n\" {close}\n",
        names.join(" | ")
    ));
    for (name, tool) in names.iter().zip(&calls.tools) {
        let head = serde_json::to_string(&format!(
            "{{\"name\": {}, \"arguments\": ",
            json_str(&tool.name)
        ))
        .expect("a string serializes");
        let schema = super::json_options(tool.parameters.clone());
        g.push_str(&format!("{name}: {head} %json {schema} \"}}\"\n"));
    }
    g
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}
