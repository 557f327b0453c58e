//! llama.cpp's GBNF grammars, converted to the Lark-like syntax llguidance compiles.
//!
//! GBNF: rules `name ::= alternatives`, `|`, grouping `( )`, `* + ?`, `{m}` `{m,}` `{m,n}`, string
//! literals with escapes, character classes `[a-z]` `[^"\\]`, `.` (any character) and `#` comments.
//! Every construct maps to one Lark construct with the same language, so nothing is approximated:
//! literals become JSON-escaped strings, classes single-character regexes, and rules get names Lark
//! accepts (`g_` plus an injective spelling of the GBNF name; `root` is the start).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Largest `{m,n}` bound: llguidance unrolls bounded repetitions.
const MAX_REPEAT: u32 = 1000;
/// Deepest nesting of parentheses (the parser recurses on them).
const MAX_DEPTH: usize = 64;

/// A GBNF grammar that does not parse; says where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GbnfError(String);

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    Literal(String),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    AnyChar,
    Rule(String),
    Repeat {
        inner: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

/// Converts a GBNF grammar to llguidance's Lark syntax.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let rules = Parser::new(gbnf).rules()?;
    if !rules.contains_key("root") {
        return Err(GbnfError("the grammar has no 'root' rule".into()));
    }
    let mut used = BTreeSet::new();
    for e in rules.values() {
        collect_refs(e, &mut used);
    }
    if let Some(missing) = used.iter().find(|r| !rules.contains_key(*r)) {
        return Err(GbnfError(format!(
            "rule '{missing}' is used but not defined"
        )));
    }
    let mut out = format!("start: {}\n", lark_name("root"));
    for (name, e) in &rules {
        let _ = writeln!(out, "{}: {}", lark_name(name), emit(e));
    }
    Ok(out)
}

fn collect_refs(e: &Expr, out: &mut BTreeSet<String>) {
    match e {
        Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| collect_refs(x, out)),
        Expr::Repeat { inner, .. } => collect_refs(inner, out),
        Expr::Rule(r) => {
            out.insert(r.clone());
        }
        Expr::Literal(_) | Expr::Class { .. } | Expr::AnyChar => {}
    }
}

/// `g_` plus the GBNF name with `_` doubled and each capital as `_` + its lower case: Lark rule names
/// are lower case, and distinct GBNF names stay distinct.
fn lark_name(gbnf: &str) -> String {
    let mut s = String::from("g_");
    for c in gbnf.chars() {
        match c {
            '_' => s.push_str("__"),
            c if c.is_ascii_uppercase() => {
                s.push('_');
                s.push(c.to_ascii_lowercase());
            }
            c => s.push(c),
        }
    }
    s
}

fn emit(e: &Expr) -> String {
    match e {
        Expr::Seq(v) if v.is_empty() => "\"\"".into(),
        Expr::Seq(v) => v.iter().map(emit_item).collect::<Vec<_>>().join(" "),
        Expr::Alt(v) => v.iter().map(emit).collect::<Vec<_>>().join(" | "),
        Expr::Literal(s) => lark_string(s),
        Expr::Class { negated, ranges } => {
            let mut r = String::from("/[");
            if *negated {
                r.push('^');
            }
            for &(lo, hi) in ranges {
                r.push_str(&regex_char(lo));
                if hi != lo {
                    r.push('-');
                    r.push_str(&regex_char(hi));
                }
            }
            r.push_str("]/");
            r
        }
        Expr::AnyChar => "/(?s:.)/".into(),
        Expr::Rule(n) => lark_name(n),
        Expr::Repeat { inner, min, max } => {
            let a = emit_operand(inner);
            match (min, max) {
                (0, None) => format!("{a}*"),
                (1, None) => format!("{a}+"),
                (0, Some(1)) => format!("{a}?"),
                (m, None) => format!("{a}{{{m},}}"),
                (m, Some(n)) => format!("{a}{{{m},{n}}}"),
            }
        }
    }
}

/// An element of a sequence: alternatives and longer sequences need parentheses.
fn emit_item(e: &Expr) -> String {
    match e {
        Expr::Alt(_) => format!("({})", emit(e)),
        Expr::Seq(v) if v.len() != 1 => format!("({})", emit(e)),
        _ => emit(e),
    }
}

/// The operand of a postfix operator: anything but a single element needs parentheses.
fn emit_operand(e: &Expr) -> String {
    match e {
        Expr::Seq(v) if v.len() == 1 => emit_operand(&v[0]),
        Expr::Alt(_) | Expr::Seq(_) | Expr::Repeat { .. } => format!("({})", emit(e)),
        _ => emit(e),
    }
}

/// A Lark (JSON-syntax) string literal.
fn lark_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A character inside a regex class: letters and digits as they are, the rest as `\x{..}` (no
/// character can then close the class, start a range or end the `/.../` literal).
fn regex_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Parser<'a> {
        Parser {
            src,
            pos: 0,
            depth: 0,
        }
    }

    fn err(&self, msg: impl std::fmt::Display) -> GbnfError {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError(format!("line {line}, column {col}: {msg}"))
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Skips whitespace (newlines too) and `#` comments.
    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.bump();
            } else if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.bump();
        }
        (self.pos > start).then(|| self.src[start..self.pos].to_string())
    }

    /// Whether a rule definition (`name ::=`) starts here: it ends the previous rule.
    fn at_definition(&self) -> bool {
        let rest = &self.src[self.pos..];
        let n = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(rest.len());
        n > 0 && rest[n..].trim_start_matches([' ', '\t']).starts_with("::=")
    }

    fn rules(mut self) -> Result<BTreeMap<String, Expr>, GbnfError> {
        let mut rules = BTreeMap::new();
        self.skip_space();
        while self.peek().is_some() {
            let Some(name) = self.name() else {
                return Err(self.err("expected a rule name"));
            };
            self.skip_space();
            if !self.src[self.pos..].starts_with("::=") {
                return Err(self.err(format!("expected '::=' after '{name}'")));
            }
            self.pos += 3;
            let body = self.alternatives()?;
            if rules.insert(name.clone(), body).is_some() {
                return Err(self.err(format!("rule '{name}' is defined twice")));
            }
            self.skip_space();
        }
        if rules.is_empty() {
            return Err(GbnfError("the grammar is empty".into()));
        }
        Ok(rules)
    }

    fn alternatives(&mut self) -> Result<Expr, GbnfError> {
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.bump();
            alts.push(self.sequence()?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one alternative")
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self) -> Result<Expr, GbnfError> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None | Some('|') | Some(')') => break,
                _ if self.at_definition() => break,
                _ => {}
            }
            let item = self.primary()?;
            let item = self.postfix(item)?;
            items.push(item);
        }
        Ok(Expr::Seq(items))
    }

    fn primary(&mut self) -> Result<Expr, GbnfError> {
        match self.peek() {
            Some('"') => {
                self.bump();
                let mut s = String::new();
                loop {
                    match self.bump() {
                        None => return Err(self.err("unterminated string literal")),
                        Some('"') => break,
                        Some('\\') => s.push(self.escape()?),
                        Some(c) => s.push(c),
                    }
                }
                Ok(Expr::Literal(s))
            }
            Some('[') => {
                self.bump();
                let negated = self.peek() == Some('^');
                if negated {
                    self.bump();
                }
                let mut ranges = Vec::new();
                loop {
                    let lo = match self.bump() {
                        None => return Err(self.err("unterminated character class")),
                        Some(']') => break,
                        Some('\\') => self.escape()?,
                        Some(c) => c,
                    };
                    let mut hi = lo;
                    if self.peek() == Some('-') && !self.src[self.pos + 1..].starts_with(']') {
                        self.bump();
                        hi = match self.bump() {
                            None => return Err(self.err("unterminated character class")),
                            Some('\\') => self.escape()?,
                            Some(c) => c,
                        };
                        if hi < lo {
                            return Err(self.err(format!("empty range '{lo}-{hi}'")));
                        }
                    }
                    ranges.push((lo, hi));
                }
                if ranges.is_empty() {
                    return Ok(if negated {
                        Expr::AnyChar
                    } else {
                        return Err(self.err("empty character class '[]'"));
                    });
                }
                Ok(Expr::Class { negated, ranges })
            }
            Some('.') => {
                self.bump();
                Ok(Expr::AnyChar)
            }
            Some('(') => {
                self.bump();
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(self.err(format!("parentheses nest deeper than {MAX_DEPTH}")));
                }
                let inner = self.alternatives()?;
                self.skip_space();
                if self.bump() != Some(')') {
                    return Err(self.err("expected ')'"));
                }
                self.depth -= 1;
                Ok(inner)
            }
            Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                Ok(Expr::Rule(self.name().expect("a name character")))
            }
            Some(c) => Err(self.err(format!("unexpected '{c}'"))),
            None => Err(self.err("unexpected end of the grammar")),
        }
    }

    fn postfix(&mut self, mut e: Expr) -> Result<Expr, GbnfError> {
        loop {
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    self.bump();
                    let (min, max) = self.bounds()?;
                    e = Expr::Repeat {
                        inner: Box::new(e),
                        min,
                        max,
                    };
                    continue;
                }
                _ => return Ok(e),
            };
            self.bump();
            e = Expr::Repeat {
                inner: Box::new(e),
                min,
                max,
            };
        }
    }

    /// `m}`, `m,}`, `m,n}` or `,n}` after the `{`.
    fn bounds(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let number = |p: &mut Parser<'_>| -> Result<Option<u32>, GbnfError> {
            p.skip_space();
            let start = p.pos;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.bump();
            }
            if p.pos == start {
                return Ok(None);
            }
            match p.src[start..p.pos].parse::<u32>() {
                Ok(n) if n <= MAX_REPEAT => Ok(Some(n)),
                _ => Err(p.err(format!("repetition bound above {MAX_REPEAT}"))),
            }
        };
        let min = number(self)?;
        self.skip_space();
        let max = if self.peek() == Some(',') {
            self.bump();
            number(self)?
        } else {
            match min {
                Some(m) => Some(m),
                None => return Err(self.err("expected a number in '{...}'")),
            }
        };
        self.skip_space();
        if self.bump() != Some('}') {
            return Err(self.err("expected '}'"));
        }
        let min = min.unwrap_or(0);
        if max.is_some_and(|n| n < min) {
            return Err(self.err(format!(
                "repetition {{{min},{}}} is empty",
                max.unwrap_or(0)
            )));
        }
        Ok((min, max))
    }

    /// The character after a backslash (in a literal or a class).
    fn escape(&mut self) -> Result<char, GbnfError> {
        let hex = |p: &mut Parser<'_>, n: usize| -> Result<char, GbnfError> {
            let digits = p.src.get(p.pos..p.pos + n).unwrap_or("");
            let v = (digits.len() == n && digits.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(digits, 16).ok())
                .flatten()
                .and_then(char::from_u32)
                .ok_or_else(|| {
                    p.err(format!(
                        "bad escape: expected {n} hex digits of a character"
                    ))
                })?;
            p.pos += n;
            Ok(v)
        };
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('r') => Ok('\r'),
            Some('t') => Ok('\t'),
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok(c),
            Some(c) => Err(self.err(format!("unknown escape '\\{c}'"))),
            None => Err(self.err("unexpected end after '\\'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_every_construct() {
        let g = r#"
# a comment
root   ::= item ("," item){0,3} tail?   # trailing comment
item   ::= [a-z] [^"\\\n]* | "q\"\x41\u00e9" | .
tail   ::= ( "x" | "y" )+ Name{2,}
Name ::= "n" | 
"#;
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g__name: \"n\" | \"\"\n\
             g_item: /[a-z]/ /[^\\x{22}\\x{5c}\\x{a}]/* | \"q\\\"Aé\" | /(?s:.)/\n\
             g_root: g_item (\",\" g_item){0,3} g_tail?\n\
             g_tail: (\"x\" | \"y\")+ g__name{2,}\n"
        );
    }

    #[test]
    fn names_stay_distinct() {
        assert_ne!(lark_name("a_b"), lark_name("a-b"));
        assert_ne!(lark_name("aB"), lark_name("a_b"));
        assert_ne!(lark_name("Ab"), lark_name("ab"));
    }

    #[test]
    fn errors_say_what_and_where() {
        let cases = [
            ("root ::= \"a", "unterminated string"),
            ("root ::= [a-", "unterminated character class"),
            ("root ::= foo", "rule 'foo' is used but not defined"),
            ("start ::= \"a\"", "no 'root' rule"),
            ("root ::= (\"a\"", "expected ')'"),
            ("root ::= \"a\"{5,2}", "is empty"),
            ("root ::= \"a\"{99999}", "repetition bound"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root = \"a\"", "expected '::='"),
            ("", "empty"),
            ("root ::= [z-a]", "empty range"),
        ];
        for (g, want) in cases {
            let e = to_lark(g).unwrap_err().to_string();
            assert!(e.contains(want), "{g:?}: {e}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100));
        assert!(to_lark(&deep)
            .unwrap_err()
            .to_string()
            .contains("nest deeper"));
    }
}
