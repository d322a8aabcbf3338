//! The calendar through the real binary (issue 37): a request published
//! while the calendar is closed waits for it and never expires by itself;
//! `publish` warns that nothing runs before the opening; start-up says
//! whether the calendar is open and when it opens; a reload that opens it
//! is acted on within `safety.recheck`. The binary reads the system clock,
//! so "Saturday" is a calendar closed now: a freeze from an hour ago to two
//! days ahead.

mod support;

use std::fs;
use std::path::Path;

use mandrill::Status;
use support::{Mandrill, history, mandrill, sqlite_url, temp_dir};

/// Open always but for a freeze around now when `frozen`: `max_defer` of
/// three seconds, looked at again every second.
fn write_config(dir: &Path, frozen: bool) {
    let db = sqlite_url(dir);
    let now = jiff::Timestamp::now().as_second();
    let at = |second: i64| jiff::Timestamp::from_second(second).unwrap().to_string();
    let freeze = if frozen {
        format!(
            "[[safety.calendar.freezes]]\nfrom = {:?}\nto = {:?}\nname = \"weekend\"\n",
            at(now - 3600),
            at(now + 2 * 86_400)
        )
    } else {
        String::new()
    };
    let config = format!(
        "[broker]\nurl = {db:?}\n[broker.sqlite]\npoll_interval = \"5ms\"\n\
         [store]\nurl = {db:?}\n\
         [restarter]\nkind = \"command\"\n[restarter.command]\nargv = [\"true\", \"{{host}}\"]\n\
         [safety]\nallow = [\"cattle-*\"]\nrequire_signed = false\ndry_run = false\n\
         max_defer = \"3s\"\nrecheck = \"1s\"\n\
         [safety.calendar]\nweekdays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         hours = [\"00:00-24:00\"]\n{freeze}"
    );
    fs::write(dir.join("mandrill.toml"), config).unwrap();
}

/// Issue 37's trap: with the calendar closed, a request was recorded
/// `expired` ("more than safety.max_defer after it was published") before
/// the calendar ever opened, and `publish` said nothing. Now `publish`
/// warns, the request is deferred again and again well past `max_defer`
/// without expiring (closed time does not count), and once a reload opens
/// the calendar it is restarted within `safety.recheck`.
#[test]
fn a_request_published_while_the_calendar_is_closed_waits_for_it_and_is_not_expired() {
    let (_guard, dir) = temp_dir();
    write_config(&dir, true);
    let service = Mandrill::run(&dir, &["--config", "mandrill.toml"]);
    service.wait_for("mandrill started", 1);
    let (status, out, stderr) = mandrill(
        &dir,
        &["publish", "--config", "mandrill.toml", "cattle-ab12"],
        &[],
    );
    assert!(status.success(), "{out}{stderr}");
    assert!(
        stderr.contains("warning: the calendar is closed now (frozen (weekend)")
            && stderr.contains("nothing published now is restarted before then"),
        "{stderr}"
    );
    // Five looks a second apart: more than max_defer (3s) since it was
    // published, all of it closed.
    service.wait_for("deferred", 5);
    assert!(service.messages("expired").is_empty(), "{}", service.raw());
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].status, Status::Received, "waiting, not expired");
    assert!(
        service
            .raw()
            .contains("restarts only inside the calendar: closed now (frozen (weekend)"),
        "start-up says the calendar is closed and when it opens: {}",
        service.raw()
    );

    // The freeze lifted by a reload: restarted at the next look.
    write_config(&dir, false);
    service.signal("HUP");
    service.wait_for("configuration reloaded", 1);
    service.wait_for("acked", 1);
    let entries = history(&sqlite_url(&dir));
    assert_eq!(entries[0].status, Status::Restarted, "{entries:?}");
    service.signal("TERM");
    let (exit, lines) = service.wait_exit();
    assert!(exit.success(), "{lines:?}");
}
