//! The command line the remote shell receives, quoted so that each
//! argument arrives as one.

/// The command line the remote shell receives: every argument quoted for a
/// POSIX shell, so that each arrives as exactly one literal argument
/// whatever it contains (`;`, `$(…)`, quotes, spaces, newlines).
pub(super) fn quote_command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One argument quoted for a POSIX shell: left alone when it holds only
/// characters no shell treats specially, else single-quoted, with each `'`
/// written as `'\''`.
fn shell_quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./,:+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        return arg.to_owned();
    }
    let mut quoted = String::with_capacity(arg.len() + 2);
    quoted.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_argument_is_quoted_for_the_remote_shell() {
        let argv: Vec<String> = [
            "sudo",
            "systemctl",
            "restart",
            "app@x.service",
            "a;b",
            "it's",
            "",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            quote_command_line(&argv),
            r#"sudo systemctl restart app@x.service 'a;b' 'it'\''s' ''"#
        );
    }
}
