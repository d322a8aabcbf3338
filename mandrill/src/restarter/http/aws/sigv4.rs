//! AWS Signature Version 4, as the Query APIs (EC2, Auto Scaling) take it:
//! a canonical request over the method, path, query, signed headers and
//! the body's SHA-256; a key derived from the secret, the day, the region
//! and the service; an `Authorization` header. Written on `hmac`/`sha2`
//! (already built) rather than the `aws-sigv4` crate and its runtime
//! types: a few dozen lines for the handful of calls mandrill makes. Pure:
//! the time is an argument.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// What is signed: everything in the request that AWS checks.
pub(crate) struct Signing<'a> {
    pub method: &'a str,
    /// The URL's path, `/` at least.
    pub path: &'a str,
    /// The query string, already in canonical form (empty for a POST).
    pub query: &'a str,
    /// Headers to sign, names lower case, sorted by name; `host` among
    /// them.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    pub region: &'a str,
    pub service: &'a str,
    /// `YYYYMMDDTHHMMSSZ`, as sent in `x-amz-date`.
    pub amz_date: &'a str,
}

/// The `Authorization` header's value for `request` signed with the key
/// pair.
pub(crate) fn authorization(request: &Signing<'_>, access_key_id: &str, secret: &str) -> String {
    let day = &request.amz_date[..8];
    let scope = format!("{day}/{}/{}/aws4_request", request.region, request.service);
    let signed_headers: Vec<&str> = request.headers.iter().map(|(name, _)| *name).collect();
    let signed_headers = signed_headers.join(";");
    let mut canonical = format!("{}\n{}\n{}\n", request.method, request.path, request.query);
    for (name, value) in request.headers {
        canonical.push_str(&format!("{name}:{}\n", value.trim()));
    }
    canonical.push_str(&format!(
        "\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(request.body))
    ));
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        request.amz_date,
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    for part in [request.region, request.service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={signed_headers}, \
         Signature={signature}"
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("hmac takes any key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// A Query API body: `application/x-www-form-urlencoded` as AWS reads it
/// (RFC 3986 unreserved characters kept, everything else percent-encoded).
pub(crate) fn form(params: &[(String, String)]) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    params
        .iter()
        .map(|(key, value)| {
            format!(
                "{}={}",
                utf8_percent_encode(key, KEEP),
                utf8_percent_encode(value, KEEP)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's own worked example ("Create a signed AWS API request",
    /// IAM `ListUsers`): the same secret, time and request give the
    /// signature AWS documents.
    #[test]
    fn the_documented_example_signs_as_aws_documents() {
        let header = authorization(
            &Signing {
                method: "GET",
                path: "/",
                query: "Action=ListUsers&Version=2010-05-08",
                headers: &[
                    (
                        "content-type",
                        "application/x-www-form-urlencoded; charset=utf-8",
                    ),
                    ("host", "iam.amazonaws.com"),
                    ("x-amz-date", "20150830T123600Z"),
                ],
                body: b"",
                region: "us-east-1",
                service: "iam",
                amz_date: "20150830T123600Z",
            },
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        );
        assert_eq!(
            header,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn a_form_body_encodes_all_but_the_unreserved_characters() {
        let body = form(&[
            ("Filter.1.Name".into(), "tag:chaos group".into()),
            ("Filter.1.Value.1".into(), "a/b=c&d~e".into()),
        ]);
        assert_eq!(
            body,
            "Filter.1.Name=tag%3Achaos%20group&Filter.1.Value.1=a%2Fb%3Dc%26d~e"
        );
    }
}
