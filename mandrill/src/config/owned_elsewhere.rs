//! The help of sections owned by modules that do not declare their settings
//! with [`settings!`](crate::settings) yet: the restarter backends and
//! verification, which other work is changing right now. Each entry
//! is that section's field and its one-line help. Move an entry into a field
//! doc (and the section into `settings!`) when its module next changes: the
//! test `every_setting_is_documented_in_help` finds a key missing here or
//! documented without a setting.

/// `[restarter.command]`
pub(super) const RESTARTER_COMMAND: &[(&str, &str)] = &[
    (
        "argv",
        "program and argument templates ({host} {instance_name} {message_id} {group}); no shell",
    ),
    ("timeout", "kill the process group after this"),
    ("working_dir", "directory to run in"),
    (
        "env_allow",
        "inherited environment variables kept; the rest is cleared",
    ),
    ("env", "extra fixed environment variables"),
    (
        "max_output",
        "bytes of stdout and of stderr kept with the outcome",
    ),
    ("permanent_exit_codes", "exit codes that mean: do not retry"),
];

/// `[restarter.ssh]`
pub(super) const RESTARTER_SSH: &[(&str, &str)] = &[
    (
        "argv",
        "remote command templates, each shell-quoted as one argument",
    ),
    ("user", "login user (the host map's wins)"),
    ("allow_root", "allow logging in as root"),
    (
        "key_file",
        "private key; default the agent and ssh's own keys",
    ),
    ("agent_socket", "ssh-agent socket"),
    ("known_hosts_file", "host keys checked strictly; required"),
    ("port", "port (the host map's wins)"),
    ("connect_timeout", "limit on connecting"),
    (
        "timeout",
        "limit on the remote command; then its process group is killed",
    ),
    (
        "max_connections",
        "connections open at once; reserve waits beyond",
    ),
    ("idle_timeout", "close a host's connection unused this long"),
    ("server_alive_interval", "keepalive period"),
    (
        "reboot_drops_connection",
        "a connection dropped by the rebooting host counts as restarted",
    ),
    ("max_output", "bytes of output kept with the outcome"),
    (
        "permanent_exit_codes",
        "remote exit codes that mean: do not retry",
    ),
];

/// `[restarter.http]`
pub(super) const RESTARTER_HTTP: &[(&str, &str)] = &[
    ("method", "HTTP method"),
    ("url", "URL template; required"),
    ("body", "body template, values JSON-escaped; \"\" for none"),
    ("headers", "header name -> value template"),
    (
        "hmac_secret_file",
        "file holding the HMAC-SHA256 key (never printed)",
    ),
    (
        "hmac_secret_env",
        "environment variable holding the HMAC-SHA256 key",
    ),
    (
        "hmac_header",
        "signature header: t=<unix>,v1=<hex HMAC-SHA256 of \"t.body\">",
    ),
    (
        "allow_plain_http",
        "allow plain http:// to an address that is not loopback",
    ),
    ("timeout", "limit on the whole call"),
    ("ca_file", "extra PEM CA certificates to trust"),
];

/// `[verify]`
pub(super) const VERIFY: &[(&str, &str)] = &[
    ("probe", "none | tcp | http | command"),
    ("port", "tcp probe: port on the host"),
    ("url", "http probe: URL template"),
    ("expect_status", "http probe: healthy statuses"),
    ("argv", "command probe: argv template, exit 0 = healthy"),
    ("initial_delay", "wait before the first probe"),
    ("interval", "between probes (jittered)"),
    ("probe_timeout", "limit on one probe"),
    (
        "timeout",
        "give up after this: the host is recorded unrecovered",
    ),
    (
        "expect_down",
        "a healthy probe counts only after a failed one",
    ),
];
