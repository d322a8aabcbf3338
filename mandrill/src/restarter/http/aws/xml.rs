//! AWS Query API answers as a small tree of elements, read with
//! quick-xml (already built for pprof's flamegraphs). The answers are a few
//! kilobytes each, so a tree that the callers walk by name reads more
//! plainly than a streaming parser per answer. Pure.

use quick_xml::Reader;
use quick_xml::events::Event;

/// One element: its local name (namespace prefixes dropped), its text
/// and its children in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Element {
    pub name: String,
    pub text: String,
    pub children: Vec<Element>,
}

/// Deepest nesting read: AWS answers are a dozen levels deep; a document
/// nested deeper is refused rather than recursed into.
const MAX_DEPTH: usize = 64;

impl Element {
    /// The document's root element, or why `text` is not XML.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut reader = Reader::from_str(text);
        reader.trim_text(true);
        let mut stack: Vec<Element> = vec![Element::default()];
        loop {
            let event = reader
                .read_event()
                .map_err(|e| format!("not XML at byte {}: {e}", reader.buffer_position()))?;
            match event {
                Event::Start(start) => {
                    if stack.len() > MAX_DEPTH {
                        return Err(format!("XML nested deeper than {MAX_DEPTH} elements"));
                    }
                    stack.push(Element {
                        name: String::from_utf8_lossy(start.local_name().as_ref()).into_owned(),
                        ..Element::default()
                    });
                }
                Event::Empty(empty) => {
                    let element = Element {
                        name: String::from_utf8_lossy(empty.local_name().as_ref()).into_owned(),
                        ..Element::default()
                    };
                    // The stack always holds the document's holder.
                    stack.last_mut().expect("a parent").children.push(element);
                }
                Event::Text(text) => {
                    let text = text.unescape().map_err(|e| format!("bad XML text: {e}"))?;
                    stack.last_mut().expect("a parent").text.push_str(&text);
                }
                Event::CData(data) => {
                    let text = String::from_utf8_lossy(&data.into_inner()).into_owned();
                    stack.last_mut().expect("a parent").text.push_str(&text);
                }
                Event::End(_) => {
                    let done = stack.pop().expect("an open element");
                    let Some(parent) = stack.last_mut() else {
                        return Err("XML closes an element it never opened".into());
                    };
                    parent.children.push(done);
                }
                Event::Eof => break,
                Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
            }
        }
        if stack.len() != 1 {
            return Err("XML ends inside an element".into());
        }
        let holder = stack.pop().expect("the holder");
        holder
            .children
            .into_iter()
            .next()
            .ok_or_else(|| "an empty XML document".to_owned())
    }

    /// The first child named `name`.
    pub(crate) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|child| child.name == name)
    }

    /// The element at `path` below this one, each step the first child of
    /// that name.
    pub(crate) fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter()
            .try_fold(self, |element, name| element.child(name))
    }

    /// The text at `path`, if the element is there and not empty.
    pub(crate) fn text_at(&self, path: &[&str]) -> Option<&str> {
        self.at(path)
            .map(|element| element.text.as_str())
            .filter(|text| !text.is_empty())
    }

    /// The children of the list at `path` (`<…Set><item>`, `<…><member>`).
    pub(crate) fn items<'a>(&'a self, path: &[&str]) -> impl Iterator<Item = &'a Element> {
        self.at(path)
            .into_iter()
            .flat_map(|list| list.children.iter())
    }

    /// The first element named `name` anywhere below, depth first.
    pub(crate) fn find(&self, name: &str) -> Option<&Element> {
        self.children.iter().find_map(|child| {
            if child.name == name {
                Some(child)
            } else {
                child.find(name)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_keeps_names_text_and_order_and_drops_namespaces() {
        let root = Element::parse(
            r#"<?xml version="1.0"?><R xmlns="urn:x"><a:set xmlns:a="urn:a"><item><k>1</k></item><item><k>a &amp; b</k><e/></item></a:set><t><![CDATA[<raw>]]></t></R>"#,
        )
        .unwrap();
        assert_eq!(root.name, "R");
        let keys: Vec<&str> = root
            .items(&["set"])
            .filter_map(|item| item.text_at(&["k"]))
            .collect();
        assert_eq!(keys, ["1", "a & b"]);
        assert_eq!(root.text_at(&["t"]), Some("<raw>"));
        assert!(root.find("e").is_some());
        assert_eq!(root.text_at(&["set", "item", "e"]), None);
    }

    #[test]
    fn broken_or_hostile_xml_is_an_error_not_a_panic() {
        for text in ["", "<a>", "<a></b>", "not xml", "</a>", &"<a>".repeat(100)] {
            assert!(Element::parse(text).is_err(), "{text:?}");
        }
    }
}
