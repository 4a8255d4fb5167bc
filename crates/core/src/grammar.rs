//! llama.cpp's GBNF, translated into llguidance's Lark dialect so that one
//! matcher (with its bounded work per token) enforces every constraint.
//! GBNF is a grammar over characters; the translation keeps it so: every
//! character, class and literal becomes a one-character lexeme, so
//! llguidance's lexer has no choice to make and the language is GBNF's.
//! Rule boundaries are read from `name ::=` alone, so rules may span lines
//! as llama.cpp's own grammars do.

use std::collections::HashMap;
use std::fmt::Write;

/// The grammar in Lark, or what is wrong with it (with its line).
pub fn to_lark(gbnf: &str) -> Result<String, String> {
    let tokens = lex(gbnf)?;
    let mut p = Parser {
        tokens,
        at: 0,
        names: HashMap::new(),
        order: Vec::new(),
        defined: Vec::new(),
    };
    let mut rules = Vec::new();
    while p.at < p.tokens.len() {
        let (name, line) = match p.next() {
            Some((Tok::Name(n), line)) => (n, line),
            Some((t, line)) => return Err(format!("line {line}: expected a rule name, found {t}")),
            None => break,
        };
        if !matches!(p.next(), Some((Tok::Defines, _))) {
            return Err(format!("line {line}: expected `::=` after `{name}`"));
        }
        let id = p.name(&name);
        if p.defined.contains(&id) {
            return Err(format!("line {line}: rule `{name}` is defined twice"));
        }
        p.defined.push(id);
        let body = p.alternatives(0)?;
        rules.push((id, body));
    }
    let Some(&root) = p.names.get("root") else {
        return Err("the grammar has no `root` rule; its text is what `root ::= …` matches".into());
    };
    if !p.defined.contains(&root) {
        return Err("the grammar has no `root` rule; its text is what `root ::= …` matches".into());
    }
    if let Some(missing) = p
        .order
        .iter()
        .enumerate()
        .find(|(i, _)| !p.defined.contains(i))
    {
        return Err(format!("rule `{}` is used but never defined", missing.1));
    }
    let mut out = format!("start: {}\n", lark_name(root, &p.order[root]));
    for (id, body) in rules {
        let _ = writeln!(out, "{}: {body}", lark_name(id, &p.order[id]));
    }
    Ok(out)
}

/// Lark rule names are lowercase; the index keeps `Value` and `value` apart.
fn lark_name(id: usize, name: &str) -> String {
    format!("r{id}_{}", name.to_ascii_lowercase())
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// A literal's characters.
    Literal(Vec<char>),
    /// A class: negated, and its ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Open,
    Close,
    Bar,
    /// `*`, `+`, `?` or `{m,n}`, as Lark writes it.
    Repeat(String),
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Name(n) => write!(f, "`{n}`"),
            Tok::Defines => f.write_str("`::=`"),
            Tok::Literal(_) => f.write_str("a string"),
            Tok::Class(..) => f.write_str("a character class"),
            Tok::Any => f.write_str("`.`"),
            Tok::Open => f.write_str("`(`"),
            Tok::Close => f.write_str("`)`"),
            Tok::Bar => f.write_str("`|`"),
            Tok::Repeat(r) => write!(f, "`{r}`"),
        }
    }
}

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let here = line;
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                out.push((Tok::Defines, here));
                i += 3;
            }
            '"' => {
                i += 1;
                let mut lit = Vec::new();
                loop {
                    match chars.get(i) {
                        None | Some('\n') => return Err(format!("line {here}: unterminated string")),
                        Some('"') => break,
                        Some(_) => {
                            let (ch, next) = char_at(&chars, i, here)?;
                            lit.push(ch);
                            i = next;
                        }
                    }
                }
                i += 1;
                out.push((Tok::Literal(lit), here));
            }
            '[' => {
                i += 1;
                let negated = chars.get(i) == Some(&'^');
                if negated {
                    i += 1;
                }
                let mut ranges = Vec::new();
                loop {
                    match chars.get(i) {
                        None | Some('\n') => {
                            return Err(format!("line {here}: unterminated character class"))
                        }
                        Some(']') => break,
                        Some(_) => {
                            let (lo, next) = char_at(&chars, i, here)?;
                            i = next;
                            let mut hi = lo;
                            if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&c| c != ']') {
                                (hi, i) = char_at(&chars, i + 1, here)?;
                                if hi < lo {
                                    return Err(format!("line {here}: range {lo:?}-{hi:?} is backwards"));
                                }
                            }
                            ranges.push((lo, hi));
                        }
                    }
                }
                i += 1;
                out.push((Tok::Class(negated, ranges), here));
            }
            '.' => {
                out.push((Tok::Any, here));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push((
                    match c {
                        '(' => Tok::Open,
                        ')' => Tok::Close,
                        '|' => Tok::Bar,
                        _ => Tok::Repeat(c.to_string()),
                    },
                    here,
                ));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| format!("line {here}: unterminated `{{`"))?;
                let inner: String = chars[i + 1..i + end].iter().collect();
                let inner: String = inner.chars().filter(|c| !c.is_whitespace()).collect();
                let bound = |s: &str| s.is_empty() || s.parse::<u32>().is_ok_and(|n| n <= 10_000);
                let ok = match inner.split_once(',') {
                    Some((m, n)) => !m.is_empty() && bound(m) && bound(n),
                    None => !inner.is_empty() && bound(&inner),
                };
                if !ok {
                    return Err(format!(
                        "line {here}: `{{{inner}}}` is not a repetition like {{2}}, {{1,}} or {{0,20}} (at most 10000)"
                    ));
                }
                out.push((Tok::Repeat(format!("{{{inner}}}")), here));
                i += end + 1;
            }
            c if word(c) => {
                let start = i;
                while i < chars.len() && word(chars[i]) {
                    i += 1;
                }
                out.push((Tok::Name(chars[start..i].iter().collect()), here));
            }
            '<' => return Err(format!("line {here}: token references (`<…>`) are not supported; write the text the token stands for")),
            other => return Err(format!("line {here}: unexpected {other:?}")),
        }
    }
    Ok(out)
}

/// The character at `i` (an escape read whole) and where the next begins.
fn char_at(chars: &[char], i: usize, line: usize) -> Result<(char, usize), String> {
    if chars[i] != '\\' {
        return Ok((chars[i], i + 1));
    }
    let hex = |n: usize| -> Result<(char, usize), String> {
        let digits: String = chars
            .get(i + 2..i + 2 + n)
            .unwrap_or_default()
            .iter()
            .collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .map(|c| (c, i + 2 + n))
            .ok_or_else(|| format!("line {line}: bad escape `\\{}{digits}`", chars[i + 1]))
    };
    match chars.get(i + 1) {
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some('t') => Ok(('\t', i + 2)),
        Some('r') => Ok(('\r', i + 2)),
        Some('n') => Ok(('\n', i + 2)),
        Some(&c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok((c, i + 2)),
        Some(c) => Err(format!("line {line}: unknown escape `\\{c}`")),
        None => Err(format!("line {line}: a `\\` ends the grammar")),
    }
}

struct Parser {
    tokens: Vec<(Tok, usize)>,
    at: usize,
    names: HashMap<String, usize>,
    order: Vec<String>,
    defined: Vec<usize>,
}

impl Parser {
    fn next(&mut self) -> Option<(Tok, usize)> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.at).map(|(t, _)| t)
    }

    fn line(&self) -> usize {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(1, |t| t.1)
    }

    fn name(&mut self, name: &str) -> usize {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        self.order.push(name.to_string());
        self.names.insert(name.to_string(), self.order.len() - 1);
        self.order.len() - 1
    }

    /// A rule's next name starts the next rule: `name ::=`.
    fn rule_starts(&self) -> bool {
        matches!(self.peek(), Some(Tok::Name(_)))
            && matches!(self.tokens.get(self.at + 1), Some((Tok::Defines, _)))
    }

    fn alternatives(&mut self, depth: usize) -> Result<String, String> {
        if depth > 100 {
            return Err(format!("line {}: groups nest deeper than 100", self.line()));
        }
        let mut alts = vec![self.sequence(depth)?];
        while self.peek() == Some(&Tok::Bar) {
            self.at += 1;
            alts.push(self.sequence(depth)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        loop {
            if self.rule_starts() {
                break;
            }
            let item = match self.peek().cloned() {
                None | Some(Tok::Bar) | Some(Tok::Close) => break,
                Some(Tok::Name(n)) => {
                    self.at += 1;
                    let id = self.name(&n);
                    lark_name(id, &n)
                }
                Some(Tok::Literal(chars)) => {
                    self.at += 1;
                    match chars.as_slice() {
                        [] => "\"\"".to_string(),
                        [one] => regex(&escape(*one)),
                        many => format!(
                            "({})",
                            many.iter()
                                .map(|&c| regex(&escape(c)))
                                .collect::<Vec<_>>()
                                .join(" ")
                        ),
                    }
                }
                Some(Tok::Class(negated, ranges)) => {
                    self.at += 1;
                    let body: String = ranges
                        .iter()
                        .map(|&(lo, hi)| {
                            if lo == hi {
                                escape(lo)
                            } else {
                                format!("{}-{}", escape(lo), escape(hi))
                            }
                        })
                        .collect();
                    if body.is_empty() {
                        return Err(format!(
                            "line {}: an empty character class matches nothing",
                            self.line()
                        ));
                    }
                    regex(&format!("[{}{body}]", if negated { "^" } else { "" }))
                }
                Some(Tok::Any) => {
                    self.at += 1;
                    regex("(?s:.)")
                }
                Some(Tok::Open) => {
                    self.at += 1;
                    let inner = self.alternatives(depth + 1)?;
                    if self.next().map(|t| t.0) != Some(Tok::Close) {
                        return Err(format!("line {}: `(` without its `)`", self.line()));
                    }
                    format!("({inner})")
                }
                Some(t @ (Tok::Repeat(_) | Tok::Defines)) => {
                    return Err(format!("line {}: unexpected {t}", self.line()))
                }
            };
            let mut item = item;
            while let Some(Tok::Repeat(r)) = self.peek().cloned() {
                self.at += 1;
                item = format!("({item}){r}");
            }
            items.push(item);
        }
        Ok(if items.is_empty() {
            "\"\"".to_string()
        } else {
            items.join(" ")
        })
    }
}

fn escape(c: char) -> String {
    format!("\\x{{{:x}}}", c as u32)
}

fn regex(body: &str) -> String {
    format!("/{body}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_grammars_translate() {
        let json = include_str!("../../../tests/data/grammars/json.gbnf");
        let lark = to_lark(json).unwrap();
        assert!(lark.starts_with("start: r0_root\n"), "{lark}");
        assert!(lark.contains("r2_value: r1_object | "), "{lark}");
        let arith = include_str!("../../../tests/data/grammars/arithmetic.gbnf");
        assert!(to_lark(arith).unwrap().contains("r1_expr: "));
        assert_eq!(
            to_lark("root ::= [a-c^] \"xy\"* .").unwrap(),
            "start: r0_root\nr0_root: /[\\x{61}-\\x{63}\\x{5e}]/ ((/\\x{78}/ /\\x{79}/))* /(?s:.)/\n"
        );
    }

    #[test]
    fn mistakes_are_named_with_their_line() {
        for (g, want) in [
            ("", "no `root` rule"),
            ("expr ::= \"a\"", "no `root` rule"),
            ("root ::= \"a\" other", "`other` is used but never defined"),
            ("root ::= \"a\nb\"", "line 1: unterminated string"),
            ("root ::= [a-", "line 1: unterminated character class"),
            (
                "root ::= \"a\"\nroot ::= \"b\"",
                "line 2: rule `root` is defined twice",
            ),
            ("root ::= (\"a\"", "`(` without its `)`"),
            ("root ::= \"\\q\"", "unknown escape `\\q`"),
            ("root ::= \"a\"{2,x}", "not a repetition"),
            ("root ::= <[1000]>", "token references"),
            ("root ::= [z-a]", "backwards"),
            ("root \"a\"", "expected `::=` after `root`"),
            ("root ::= * \"a\"", "unexpected `*`"),
        ] {
            let e = to_lark(g).unwrap_err();
            assert!(e.contains(want), "{g:?}: {e}");
        }
    }
}
