//! What configuration and the adapters that own settings sections share,
//! so that neither depends on the other: [`Secret`], the redaction of
//! secrets, the duration format, and [`settings!`], which declares a
//! section once.
//!
//! A section's field docs are its help text. `settings!` takes a struct whose
//! fields each carry a default (`field: Type = default`), and emits the
//! struct as written, its `Default`, and its [`Documented::DOCS`]: each
//! field's name and type with its doc. `mandrill run --help` shows a doc's first
//! paragraph; later paragraphs say why, for readers of the code, and
//! docs/settings.md shows the whole doc. So a key's doc is written once,
//! next to the field, and cannot drift from the help or the reference.

pub(crate) mod duration;
pub(crate) mod redact;
mod secret;

pub(crate) use redact::{Redactor, redact_url};
pub(crate) use secret::Secret;

/// A settings section that documents its fields (see [`settings!`]).
pub(crate) trait Documented {
    /// Every field, in declaration order.
    const DOCS: &'static [Field];
}

/// A field of a settings section, as [`settings!`] saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Field {
    /// The field's name: its key within the section.
    pub name: &'static str,
    /// The field's Rust type as written, e.g. `Option<PathBuf>`.
    pub ty: &'static str,
    /// The field's whole doc comment, one line per `///` line.
    pub doc: &'static str,
}

/// The first paragraph of a field's doc, on one line: what `--help` shows.
pub(crate) fn summary(doc: &str) -> String {
    doc.lines()
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Declares a settings section: the struct as written (its attributes, and
/// each field's docs and `serde` attributes), a `Default` from the field
/// defaults, and [`Documented`] from the field docs.
///
/// ```ignore
/// settings! {
///     /// `[simulate]`
///     #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
///     #[serde(deny_unknown_fields, default)]
///     pub struct SimulateSettings {
///         /// Requests per second (reloadable).
///         pub rate: f64 = 2.0,
///     }
/// }
/// ```
macro_rules! settings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $(#[serde($($serde:tt)*)])*
                $field_vis:vis $field:ident: $ty:ty = $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                $(#[doc = $doc])*
                $(#[serde($($serde)*)])*
                $field_vis $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                }
            }
        }

        impl $crate::settings::Documented for $name {
            const DOCS: &'static [$crate::settings::Field] = &[
                $($crate::settings::Field {
                    name: stringify!($field),
                    ty: stringify!($ty),
                    doc: concat!($($doc, "\n",)*),
                },)*
            ];
        }
    };
}

pub(crate) use settings;

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    settings! {
        /// An example.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        struct Example {
            /// How often.
            ///
            /// Why: a second paragraph, only for readers of the code.
            #[serde(with = "duration")]
            every: std::time::Duration = std::time::Duration::from_secs(3),
            /// A name
            /// on two lines.
            name: String = "x".into(),
        }
    }

    #[test]
    fn a_section_is_declared_once_with_its_defaults_and_docs() {
        let example = Example::default();
        assert_eq!(example.every, std::time::Duration::from_secs(3));
        assert_eq!(example.name, "x");
        let docs: Vec<(&str, &str, String)> = Example::DOCS
            .iter()
            .map(|field| (field.name, field.ty, summary(field.doc)))
            .collect();
        assert_eq!(
            docs,
            [
                ("every", "std::time::Duration", "How often.".to_owned()),
                ("name", "String", "A name on two lines.".to_owned())
            ]
        );
        let parsed: Example = toml::from_str("every = \"1m\"").unwrap();
        assert_eq!(parsed.every, std::time::Duration::from_secs(60));
        assert_eq!(parsed.name, "x");
    }
}
