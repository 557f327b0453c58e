//! Markdown tables for the subcommands' human-readable output (pasteable into documentation).

/// `header` and `rows` as a Markdown table, columns padded to their widest cell (in chars); columns
/// from `first_numeric` on are right-aligned and marked so in the rule line.
pub fn markdown(header: &[&str], rows: &[Vec<String>], first_numeric: usize) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let numeric = |c: usize| c >= first_numeric;
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells
            .enumerate()
            .map(|(c, s)| {
                if numeric(c) {
                    format!("{s:>w$}", w = widths[c])
                } else {
                    format!("{s:<w$}", w = widths[c])
                }
            })
            .collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut t = line(&mut header.iter().copied());
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(c, &w)| {
            if numeric(c) {
                format!("{}:", "-".repeat(w + 1))
            } else {
                "-".repeat(w + 2)
            }
        })
        .collect();
    t.push_str(&format!("|{}|\n", rule.join("|")));
    for r in rows {
        t.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn pads_and_aligns() {
        let t = super::markdown(
            &["name", "n"],
            &[
                vec!["é".into(), "10".into()],
                vec!["long".into(), "2".into()],
            ],
            1,
        );
        assert_eq!(
            t,
            "| name |  n |\n|------|---:|\n| é    | 10 |\n| long |  2 |\n"
        );
    }
}
