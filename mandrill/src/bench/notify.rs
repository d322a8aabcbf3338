//! `--notify slow|down|URL`: a `[[notify]]` endpoint wanting every
//! restarted and failed request, and the slow receiver it may point at.

use std::sync::Arc;
use std::time::Duration;

use crate::notify::{EventKind, Format, Notifier, NotifierSettings, NotifyEntry};
use crate::stats::Stats;

/// The notifier for `--notify`, if given: `slow` is a receiver in this
/// process that answers after 10 s, `down` a port nothing listens on.
pub(super) async fn notifier(target: Option<&str>, stats: &Arc<Stats>) -> Option<Arc<Notifier>> {
    let target = target?;
    let url = match target {
        "slow" => slow_receiver().await,
        "down" => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
            format!("http://{}/down", listener.local_addr().expect("bound"))
        }
        url => url.to_owned(),
    };
    let entry = NotifyEntry {
        url: crate::settings::Secret(url),
        format: Format::Json,
        events: vec![EventKind::Restarted, EventKind::Failed],
        timeout: Duration::from_secs(30),
    };
    Notifier::start(&[entry], &NotifierSettings::default(), stats.clone()).expect("notifier starts")
}

/// A webhook receiver on this runtime that answers every POST after 10 s.
async fn slow_receiver() -> String {
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "ok"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/slow")
}
