//! Error signatures: a stable hash of an error with its variable parts masked, so that
//! "timeout after 31s on order 8812" and "timeout after 29s on order 17" group together.

use sha2::{Digest, Sha256};

use crate::error::{ErrorClass, ProcessError};

/// Units that turn a number into a duration ("31s", "250 ms").
const DURATION_UNITS: &[&str] = &[
    "ns", "us", "µs", "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute",
    "minutes", "h", "hr", "hrs", "hour", "hours",
];

/// Returns an error message as it may be logged (docs/ARCHITECTURE.md §1.9): what it quotes
/// (`"…"`, `` `…` ``, `'…'`: serde, envelope and most library errors quote the offending
/// value) is dropped and the variable parts masked as for a signature, so a payload's
/// values never reach the logs; the message itself is kept whole in the record.
pub fn loggable_message(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut out = String::with_capacity(message.len());
    let mut open: Option<char> = None;
    let word = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric());
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let before = i.checked_sub(1).and_then(|j| chars.get(j));
        let after = chars.get(i + 1);
        match open {
            // An escaped character (serde writes strings with Debug escapes) closes nothing.
            Some(_) if c == '\\' => i += 1,
            // An apostrophe closes a single-quoted value only before a space, punctuation
            // or the end ("'O'Brien Ada'" is one value).
            Some('\'') if c == '\'' && word(after) => {}
            Some(quote) if c == quote => {
                out.push('…');
                out.push(c);
                open = None;
            }
            Some(_) => {}
            // An apostrophe inside a word ("isn't") opens nothing.
            None if c == '\'' && word(before) => out.push(c),
            None if matches!(c, '"' | '`' | '\'') => {
                out.push(c);
                open = Some(c);
            }
            None => out.push(c),
        }
        i += 1;
    }
    if open.is_some() {
        out.push('…');
    }
    normalize_message(&out)
}

/// Masks the variable parts of an error message: UUIDs become `<uuid>`, numbers with a
/// time unit `<duration>`, hex or mixed ids of 8+ characters `<id>`, other numbers `<n>`.
pub fn normalize_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let tokens = tokenize(message);
    let mut i = 0;
    while i < tokens.len() {
        let (token, is_word) = tokens[i];
        if !is_word {
            out.push_str(token);
            i += 1;
            continue;
        }
        if is_uuid(token) {
            out.push_str("<uuid>");
        } else if let Some(rest) = strip_number(token) {
            if DURATION_UNITS.contains(&rest) && !rest.is_empty() {
                out.push_str("<duration>");
            } else if rest.is_empty() {
                // "31 s": a number followed by a separate unit word.
                let next_unit = tokens
                    .get(i + 1)
                    .filter(|(t, w)| !*w && *t == " ")
                    .and_then(|_| tokens.get(i + 2));
                match next_unit {
                    Some((unit, true)) if DURATION_UNITS.contains(unit) => {
                        out.push_str("<duration>");
                        i += 3;
                        continue;
                    }
                    _ => out.push_str("<n>"),
                }
            } else if is_id_like(token) {
                out.push_str("<id>");
            } else {
                out.push_str("<n>");
                out.push_str(rest);
            }
        } else if is_id_like(token) {
            out.push_str("<id>");
        } else {
            out.push_str(&mask_digit_runs(token));
        }
        i += 1;
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Returns the signature of an error: the first 16 hex digits of sha256 over the class and the
/// normalised message.
pub fn error_signature(class: ErrorClass, message: &str) -> String {
    let normalized = normalize_message(message);
    let digest = Sha256::new()
        .chain_update(class.as_str().as_bytes())
        .chain_update(b"\n")
        .chain_update(normalized.as_bytes())
        .finalize();
    ::hex::encode(&digest[..8])
}

/// Splits text into words (alphanumerics plus `-`, `_`, `.` between alphanumerics) and the
/// separators between them; `true` marks a word.
fn tokenize(text: &str) -> Vec<(&str, bool)> {
    let mut tokens = Vec::new();
    let mut start = 0;
    let mut in_word = false;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (n, &(pos, c)) in chars.iter().enumerate() {
        let joiner = matches!(c, '-' | '_' | '.')
            && in_word
            && chars
                .get(n + 1)
                .is_some_and(|(_, next)| next.is_alphanumeric());
        let word_char = c.is_alphanumeric() || joiner;
        if word_char != in_word {
            if pos > start {
                tokens.push((&text[start..pos], in_word));
            }
            start = pos;
            in_word = word_char;
        }
    }
    if start < text.len() {
        tokens.push((&text[start..], in_word));
    }
    tokens
}

/// If `token` starts with a number (digits, optional decimal part), the rest after it.
fn strip_number(token: &str) -> Option<&str> {
    let digits = token
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(token.len());
    if digits == 0 {
        return None;
    }
    let mut rest = &token[digits..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        if n > 0 {
            rest = &frac[n..];
        }
    }
    Some(rest)
}

fn is_uuid(token: &str) -> bool {
    let parts: Vec<&str> = token.split('-').collect();
    parts.len() == 5
        && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Ids: 8+ characters mixing digits with letters (hex digests, request ids, "req-8f3a...").
fn is_id_like(token: &str) -> bool {
    token.len() >= 8
        && token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_alphabetic())
}

fn mask_digit_runs(token: &str) -> String {
    let mut out = String::with_capacity(token.len());
    let mut in_digits = false;
    for c in token.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push_str("<n>");
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

/// Class, message and causes; never [`ProcessError::detail`].
impl ProcessError {
    /// Returns the error as a log line may carry it: class, code and a message with what it quotes
    /// dropped and numbers masked ([`loggable_message`]); a panic's
    /// message (the handler's own text, which may hold any value) not at all. The whole
    /// message goes into the record only.
    pub fn loggable(&self) -> String {
        let message = if self.step.as_deref() == Some("panic") {
            "the processor panicked (its message is in the record)".to_string()
        } else {
            loggable_message(&self.message)
        };
        match &self.code {
            Some(code) => format!("{} ({code}): {message}", self.class),
            None => format!("{}: {message}", self.class),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_group_together() {
        assert_eq!(
            error_signature(ErrorClass::Timeout, "timeout after 31s"),
            error_signature(ErrorClass::Timeout, "timeout after 29s")
        );
        assert_eq!(
            normalize_message("timeout after 31s"),
            "timeout after <duration>"
        );
        assert_eq!(normalize_message("took 2.5 seconds"), "took <duration>");
        assert_eq!(normalize_message("waited 250ms"), "waited <duration>");
    }

    #[test]
    fn ids_and_numbers_are_masked() {
        assert_eq!(
            normalize_message("order 8812 failed for 3f2504e0-4f89-11d3-9a0c-0305e82c3301"),
            "order <n> failed for <uuid>"
        );
        assert_eq!(
            normalize_message("request id 8f3a9c01d2e4 rejected"),
            "request id <id> rejected"
        );
        assert_eq!(normalize_message("item-42 missing"), "item-<n> missing");
        assert_eq!(
            normalize_message("downstream answered 503 Service Unavailable"),
            "downstream answered <n> Service Unavailable"
        );
    }

    #[test]
    fn different_errors_and_classes_differ() {
        let a = error_signature(ErrorClass::Validation, "missing field `id`");
        let b = error_signature(ErrorClass::Validation, "missing field `name`");
        let c = error_signature(ErrorClass::Unknown, "missing field `id`");
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn whitespace_is_normalised() {
        assert_eq!(normalize_message("  a \n b  "), "a b");
    }

    #[test]
    fn a_loggable_message_carries_no_payload_value() {
        let card = "4111 1111 1111 1111";
        // What serde, an envelope and a panic put in a message.
        let typed = format!(
            "the payload does not fit Order: .card: invalid type: string \"{card}\", expected u64 at line 1 column 33"
        );
        let envelope = "the SNS envelope's Message must be a string, found invalid type: integer `4111111111111111`";
        // serde's own rendering of a value that holds quotes, and a name with an apostrophe.
        let escaped = serde_json::from_str::<u64>(r#""x\" Ada Lovelace \"""#)
            .unwrap_err()
            .to_string();
        for message in [
            typed.as_str(),
            envelope,
            escaped.as_str(),
            "name 'Ada Lovelace' is not allowed",
            "name 'O'Brien Ada' is not allowed",
            "unterminated \"4111",
        ] {
            let logged = loggable_message(message);
            for value in ["4111", "Ada", "Lovelace"] {
                assert!(!logged.contains(value), "{logged}");
            }
        }
        // What the message says about the error stays readable.
        assert_eq!(
            loggable_message(&typed),
            "the payload does not fit Order: .card: invalid type: string \"…\", expected u<n> at line <n> column <n>"
        );
        assert_eq!(loggable_message("isn't a number"), "isn't a number");
        let panic = crate::ProcessError::new(
            crate::ErrorClass::Unknown,
            format!("the processor panicked: card {card}"),
        )
        .with_step("panic");
        assert_eq!(
            panic.loggable(),
            "unknown: the processor panicked (its message is in the record)"
        );
    }
}
