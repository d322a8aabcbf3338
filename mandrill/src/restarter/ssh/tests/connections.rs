//! The connection pool: one master connection per host, shared, closed
//! when idle, bounded by `max_connections`.

use super::*;

#[tokio::test]
async fn restarts_of_one_host_share_one_connection_which_closes_when_idle() {
    let sshd = PrivateSshd::start();
    let settings = SshSettings {
        idle_timeout: Duration::from_secs(2),
        ..ssh_settings(&sshd, &["true"])
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();

    restart(&restarter, "cattle-ab12").await.unwrap();
    restart(&restarter, "cattle-cd34").await.unwrap();
    assert_eq!(sshd.logins(), 1, "both restarts used one connection");

    wait_until("the idle connection is closed", || {
        sshd.log().contains("Disconnected from user")
    })
    .await;
    restart(&restarter, "cattle-ab12").await.unwrap();
    assert_eq!(
        sshd.logins(),
        2,
        "a new connection after the idle one closed"
    );
}

#[tokio::test]
async fn a_connection_dropped_by_the_host_counts_as_restarted_only_when_configured() {
    let sshd = PrivateSshd::start();
    let script = sshd.script("drop-connection.sh", DROP_OWN_CONNECTION);
    let listener = sshd.pid().to_string();
    let argv = [script.to_str().unwrap(), listener.as_str()];

    let strict = SshRestarter::new(&ssh_settings(&sshd, &argv), loopback()).unwrap();
    let error = restart(&strict, "cattle-ab12").await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    let text = error.with_causes().to_string();
    assert!(text.contains("dropped the connection"), "{text}");

    let settings = SshSettings {
        reboot_drops_connection: true,
        ..ssh_settings(&sshd, &argv)
    };
    let lenient = SshRestarter::new(&settings, loopback()).unwrap();
    let restarted = restart(&lenient, "cattle-ab12").await.unwrap();
    let output = restarted.output.unwrap_or_default();
    assert!(output.contains("dropped the connection"), "{output}");
    assert_eq!(sshd.logins(), 2);
}

#[tokio::test]
async fn reserve_waits_for_a_free_connection() {
    let dir = TempDir::new().unwrap();
    let known_hosts = dir.path().join("known_hosts");
    fs::write(&known_hosts, "").unwrap();
    let settings = SshSettings {
        argv: vec!["true".into()],
        known_hosts_file: Some(known_hosts),
        max_connections: 1,
        ..SshSettings::default()
    };
    let restarter = SshRestarter::new(&settings, loopback()).unwrap();
    let request = request("cattle-ab12");
    let first = restarter
        .reserve(&request)
        .await
        .expect("ssh never refuses");
    let mut second = Box::pin(restarter.reserve(&request));
    assert!(
        futures::FutureExt::now_or_never(&mut second).is_none(),
        "no second connection while the first is held"
    );
    drop(first);
    second.await.expect("ssh never refuses");
}

#[tokio::test]
async fn idle_connections_are_closed_to_stay_within_max_connections_and_the_host_map_wins() {
    let sshd = PrivateSshd::start();
    let host_key = fs::read_to_string(sshd.path("host_key.pub")).unwrap();
    let known_hosts = sshd.path("known_hosts.both");
    fs::write(
        &known_hosts,
        format!(
            "[127.0.0.1]:{0} {host_key}[localhost]:{0} {host_key}",
            sshd.port
        ),
    )
    .unwrap();
    // The host map's port and user win over the section's.
    let settings = SshSettings {
        known_hosts_file: Some(known_hosts),
        max_connections: 1,
        port: 9,
        user: None,
        ..ssh_settings(&sshd, &["true"])
    };
    // Two destinations: the same sshd under two names.
    let entry = |pattern: &str, address: &str| HostEntry {
        pattern: pattern.into(),
        address: Some(address.into()),
        port: Some(sshd.port),
        user: Some(sshd::current_user()),
    };
    let hosts = HostMap::new(&[entry("a-*", "127.0.0.1"), entry("b-*", "localhost")]).unwrap();
    let restarter = SshRestarter::new(&settings, hosts).unwrap();

    restart(&restarter, "a-1").await.unwrap();
    restart(&restarter, "b-1").await.unwrap();

    assert_eq!(sshd.logins(), 2);
    wait_until("the first connection is closed", || {
        sshd.log().matches("Disconnected from user").count() == 1
    })
    .await;
}
