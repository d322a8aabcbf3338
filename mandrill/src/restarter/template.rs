//! Templates for what a backend sends: an argv, a URL, a body. The
//! placeholders `{host}`, `{instance_name}`, `{message_id}` and `{group}` are
//! replaced per request by whole values: a value is never split into
//! arguments, never reaches a shell, and, in a JSON body, is escaped as a
//! JSON string, and, in a URL, is percent-encoded: only letters, digits,
//! `-`, `.`, `_` and `~` pass as they are, so no value adds a user, a host,
//! a path, a query or a fragment. An IPv6 address (written bare, `fd00::1`)
//! goes into a URL in brackets (`[fd00::1]`), as a URL's host is written.
//! `{{` and `}}` stand for literal braces. An unknown placeholder is
//! refused when the configuration is loaded.

use std::fmt;
use std::net::Ipv6Addr;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::domain::RestartRequest;

/// What a value keeps unencoded in a URL: RFC 3986's unreserved characters.
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One value a template can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    Host,
    InstanceName,
    MessageId,
    Group,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(Var),
}

/// A parsed template. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    raw: String,
    parts: Vec<Part>,
}

/// The values a template is filled with, for one request.
#[derive(Debug, Clone)]
pub(crate) struct Values<'a> {
    /// Where to reach the host: the host map's address, else the hostname.
    pub host: &'a str,
    /// The request.
    pub request: &'a RestartRequest,
}

impl Template {
    /// Parses `raw`, naming an unknown placeholder or an unmatched brace,
    /// never quoting `raw` (it may hold a token).
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    let var = match name.as_str() {
                        "host" => Var::Host,
                        "instance_name" => Var::InstanceName,
                        "message_id" => Var::MessageId,
                        "group" => Var::Group,
                        _ => {
                            // The text itself is not echoed: a URL or a
                            // header may hold a token. Nor is what follows
                            // a `{` unless it reads as a placeholder's name
                            // (`Bearer ab{cdS3cr3t` is a token, not one).
                            let named = closed
                                && name.len() <= 32
                                && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                            let which = if named {
                                format!("an unknown placeholder {{{name}}}")
                            } else {
                                "a `{` that starts no placeholder (what follows it is not shown)"
                                    .to_owned()
                            };
                            return Err(format!(
                                "has {which} (known: {{host}}, {{instance_name}}, \
                                 {{message_id}}, {{group}}; {{{{ and }}}} for literal braces)"
                            ));
                        }
                    };
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Var(var));
                }
                '}' => return Err("has an unmatched '}' (write }} for one)".into()),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Self {
            raw: raw.to_owned(),
            parts,
        })
    }

    /// The template filled with `values`, each inserted as is.
    pub(crate) fn render(&self, values: &Values<'_>) -> String {
        self.render_escaped(values, |value, out| out.push_str(value))
    }

    /// The template filled with `values` for a URL: each percent-encoded,
    /// an IPv6 address in brackets (see the module docs).
    pub(crate) fn render_url(&self, values: &Values<'_>) -> String {
        self.render_escaped(values, |value, out| {
            if let Ok(v6) = value.parse::<Ipv6Addr>() {
                out.push_str(&format!("[{v6}]"));
            } else {
                out.extend(utf8_percent_encode(value, URL_VALUE));
            }
        })
    }

    /// The template filled with `values`, each escaped as the contents of a
    /// JSON string (the template supplies the quotes).
    pub(crate) fn render_json(&self, values: &Values<'_>) -> String {
        self.render_escaped(values, |value, out| {
            // A string always serialises; strip the quotes it adds.
            let quoted = serde_json::to_string(value).unwrap_or_default();
            out.push_str(&quoted[1..quoted.len().saturating_sub(1).max(1)]);
        })
    }

    fn render_escaped(&self, values: &Values<'_>, escape: impl Fn(&str, &mut String)) -> String {
        let mut out = String::with_capacity(self.raw.len() + 32);
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Var(var) => {
                    let request = values.request;
                    let message_id = request.message_id.to_string();
                    let value = match var {
                        Var::Host => values.host,
                        Var::InstanceName => request.instance_name.as_str(),
                        Var::MessageId => &message_id,
                        Var::Group => request.group(),
                    };
                    escape(value, &mut out);
                }
            }
        }
        out
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// An argv template: each argument is a template, and each renders to
/// exactly one argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ArgvTemplate(Vec<Template>);

impl ArgvTemplate {
    /// Parses every argument; the program (the first) must be literal and
    /// present.
    pub(crate) fn parse(argv: &[String]) -> Result<Self, String> {
        let Some(program) = argv.first() else {
            return Err("is empty: name at least the program to run".into());
        };
        if program.contains('{') {
            return Err(format!(
                "the program {program:?} must be literal, not a template"
            ));
        }
        argv.iter()
            .enumerate()
            .map(|(index, arg)| Template::parse(arg).map_err(|why| format!("[{index}] {why}")))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// The arguments for one request, the program first.
    pub(crate) fn render(&self, values: &Values<'_>) -> Vec<String> {
        self.0.iter().map(|arg| arg.render(values)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::request;

    #[test]
    fn placeholders_become_whole_values() {
        let request = request("cattle-ab12");
        let values = Values {
            host: "10.0.0.7",
            request: &request,
        };
        let argv = ArgvTemplate::parse(&[
            "kubectl".into(),
            "delete".into(),
            "pod/{instance_name}".into(),
            "--host={host}".into(),
            "{group}:{message_id}".into(),
            "{{literal}}".into(),
        ])
        .unwrap();
        assert_eq!(
            argv.render(&values),
            [
                "kubectl",
                "delete",
                "pod/cattle-ab12",
                "--host=10.0.0.7",
                format!("cattle:{}", request.message_id).as_str(),
                "{literal}",
            ]
        );
    }

    #[test]
    fn a_value_can_never_add_an_argument_or_break_out_of_a_json_string() {
        let request = request("cattle-ab12");
        // The host map may hold anything an operator typed.
        let values = Values {
            host: "a b;rm -rf /\"}\n",
            request: &request,
        };
        let argv = ArgvTemplate::parse(&["ssh".into(), "{host}".into()]).unwrap();
        assert_eq!(argv.render(&values).len(), 2);
        let body = Template::parse(r#"{{"host": "{host}"}}"#).unwrap();
        let json: serde_json::Value = serde_json::from_str(&body.render_json(&values)).unwrap();
        assert_eq!(json["host"], "a b;rm -rf /\"}\n");
    }

    /// The host map and the inventory feed `{host}`: whatever they hold, a
    /// URL template's request goes to the host the template names, with
    /// the path and query it names.
    #[test]
    fn a_value_cannot_change_where_a_url_goes() {
        let request = request("cattle-ab12");
        let url = Template::parse("https://{host}:8443/restart/{instance_name}?g={group}").unwrap();
        for host in [
            "evil.example/",
            "x@evil.example#",
            "evil.example?",
            "evil.example:1/",
            "a b\\evil.example",
            "[::1]",
        ] {
            let rendered = url.render_url(&Values {
                host,
                request: &request,
            });
            if let Ok(parsed) = url::Url::parse(&rendered) {
                assert_ne!(
                    parsed.host_str(),
                    Some("evil.example"),
                    "{host}: {rendered}"
                );
                assert_eq!(parsed.username(), "", "{host}: {rendered}");
                assert_eq!(parsed.port(), Some(8443), "{host}: {rendered}");
                assert_eq!(parsed.path(), "/restart/cattle-ab12", "{host}: {rendered}");
                assert_eq!(parsed.query(), Some("g=cattle"), "{host}: {rendered}");
                assert_eq!(parsed.fragment(), None, "{host}: {rendered}");
            }
        }
        let at = |host: &str| {
            url.render_url(&Values {
                host,
                request: &request,
            })
        };
        assert_eq!(
            at("10.0.0.7"),
            "https://10.0.0.7:8443/restart/cattle-ab12?g=cattle"
        );
        assert_eq!(
            at("web-1.example.net"),
            "https://web-1.example.net:8443/restart/cattle-ab12?g=cattle"
        );
        let v6 = url::Url::parse(&at("fd00::1")).unwrap();
        assert_eq!(v6.host_str(), Some("[fd00::1]"));
        assert_eq!(v6.port(), Some(8443));
    }

    /// A URL or a header may hold a token: a bad template's error names
    /// the fault, never the text.
    #[test]
    fn a_bad_templates_error_does_not_quote_it() {
        for raw in [
            "https://ops:S3cr3t@hooks.example/{instanc}",
            "Bearer S3cr3t}",
            "Bearer ab{cdS3cr3t",
            "Bearer ab{S3cr3t}",
        ] {
            let why = Template::parse(raw).unwrap_err();
            assert!(!why.contains("S3cr3t"), "{why}");
        }
        let argv = [
            "curl".to_owned(),
            "-u".to_owned(),
            "ops:S3cr3t{".to_owned() + "x}",
        ];
        let why = ArgvTemplate::parse(&argv).unwrap_err();
        assert!(!why.contains("S3cr3t") && why.starts_with("[2]"), "{why}");
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        let unknown = Template::parse("{hostname}").unwrap_err();
        assert!(
            unknown.contains("unknown placeholder {hostname}"),
            "{unknown}"
        );
        assert!(Template::parse("a}b").unwrap_err().contains("unmatched"));
        assert!(ArgvTemplate::parse(&[]).unwrap_err().contains("empty"));
        assert!(
            ArgvTemplate::parse(&["{host}".into()])
                .unwrap_err()
                .contains("literal")
        );
    }
}
