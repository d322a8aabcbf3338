//! Glob patterns over instance names: `*` matches any run of characters
//! (including none), `?` exactly one; everything else matches itself. Used
//! by the host map, and by the safety guards' allow and deny lists.

use std::fmt;

/// A parsed glob pattern. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern(String);

impl Pattern {
    /// Parses a pattern; an empty one is refused (it would match nothing,
    /// which is never what was meant).
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("an empty pattern matches nothing".into());
        }
        Ok(Self(raw.to_owned()))
    }

    /// Whether `name` matches the whole pattern.
    pub(crate) fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }

    /// How specific the pattern is: the number of literal characters.
    pub(crate) fn specificity(&self) -> usize {
        self.0.bytes().filter(|b| !matches!(b, b'*' | b'?')).count()
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Iterative glob matching with one backtrack point (the last `*`): linear
/// in practice, never exponential.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        let cases = [
            ("cattle-*", "cattle-ab12", true),
            ("cattle-*", "cattle-", true),
            ("cattle-*", "pet-ab12", false),
            ("*-ab12", "cattle-ab12", true),
            ("cattle-??12", "cattle-ab12", true),
            ("cattle-??12", "cattle-abc12", false),
            ("*", "anything", true),
            ("c*e*-*2", "cattle-ab12", true),
            ("cattle", "cattle-ab12", false),
            ("cattle-ab12", "cattle-ab12", true),
            ("**a", "aaaa", true),
            ("*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaac", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(
                Pattern::parse(pattern).unwrap().matches(name),
                expected,
                "{pattern} vs {name}"
            );
        }
        assert!(Pattern::parse("").is_err());
        assert!(
            Pattern::parse("cattle-ab12").unwrap().specificity()
                > Pattern::parse("cattle-*").unwrap().specificity()
        );
    }
}
