//! The queue's password found as libpq finds it, against a real server
//! that asks a role for it (SCRAM): PGPASSWORD, a password file (and the
//! 0600 rule), `passfile=`, a pg_service.conf service; a password nowhere
//! or a wrong one says where passwords go, never the password.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Mutex;

use longhaul_fleet::queue::Queue;
use longhaul_testkit::pg::TempPostgres;

const SECRET: &str = "SECRET-pw-41b7";

/// The variables these tests set are the process's: one test at a time.
static ENV: Mutex<()> = Mutex::new(());

const VARS: &[&str] = &[
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGSYSCONFDIR",
    "HOME",
];

/// Runs `f` with only `vars` of libpq's set (HOME an empty directory).
fn with_env<T>(home: &Path, vars: &[(&str, &str)], f: impl FnOnce() -> T) -> T {
    let _g = ENV.lock().unwrap_or_else(|e| e.into_inner());
    for k in VARS {
        std::env::remove_var(k);
    }
    std::env::set_var("HOME", home);
    std::env::set_var("PGSYSCONFDIR", home);
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let r = f();
    for k in VARS {
        std::env::remove_var(k);
    }
    r
}

fn connect_err(url: &str) -> String {
    match Queue::connect(url, "pw") {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn the_password_comes_from_pgpassword_or_a_private_pgpass_never_the_url() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    let url = pg.password_user("lh_pw", SECRET);
    let home = tempfile::tempdir().unwrap();

    // Nowhere: refused, and told where a password goes.
    let e = with_env(home.path(), &[], || connect_err(&url));
    assert!(
        e.contains("PGPASSWORD") && e.contains(".pgpass"),
        "no hint: {e}"
    );

    // PGPASSWORD.
    with_env(home.path(), &[("PGPASSWORD", SECRET)], || {
        let mut q = Queue::connect(&url, "pw").expect("PGPASSWORD");
        assert!(!q.encrypted().unwrap());
    });
    // A wrong one: says where it came from, not what it was.
    let e = with_env(home.path(), &[("PGPASSWORD", "wrong-one-9")], || {
        connect_err(&url)
    });
    assert!(e.contains("from PGPASSWORD"), "{e}");
    assert!(!e.contains("wrong-one-9"), "the password is shown: {e}");

    // ~/.pgpass, the first matching line, `*` and escapes as libpq reads them.
    let pgpass = home.path().join(".pgpass");
    let lines = format!(
        "# host:port:db:user:password\nother.example:*:*:*:nope\n127.0.0.1:{}:postgres:lh_pw:{SECRET}\n*:*:*:*:too-late\n",
        pg.port
    );
    write_mode(&pgpass, &lines, 0o600);
    with_env(home.path(), &[], || {
        Queue::connect(&url, "pw").expect("~/.pgpass");
    });
    // Readable by others: ignored, as libpq ignores it, and said.
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = with_env(home.path(), &[], || connect_err(&url));
    assert!(
        e.contains("group or world access") && e.contains("chmod 600"),
        "{e}"
    );
    assert!(!e.contains(SECRET), "{e}");

    // PGPASSFILE, and passfile= in the URL (a file of its own, 0600 too).
    let other = home.path().join("queue.pass");
    write_mode(&other, &format!("*:*:*:lh_pw:{SECRET}\n"), 0o600);
    let other_s = other.to_str().unwrap();
    with_env(home.path(), &[("PGPASSFILE", other_s)], || {
        Queue::connect(&url, "pw").expect("PGPASSFILE");
    });
    with_env(home.path(), &[], || {
        Queue::connect(&format!("{url}?passfile={other_s}"), "pw").expect("passfile=");
    });
    write_mode(&other, &format!("*:*:*:lh_pw:{SECRET}\n"), 0o640);
    let e = with_env(home.path(), &[], || {
        connect_err(&format!("{url}?passfile={other_s}"))
    });
    assert!(e.contains("chmod 600"), "{e}");
}

#[test]
fn a_service_of_pg_service_conf_names_the_database_and_its_password() {
    let Some(pg) = TempPostgres::start() else {
        return;
    };
    pg.password_user("lh_svc", SECRET);
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join(".pg_service.conf");
    write_mode(
        &file,
        &format!(
            "[elsewhere]\nhost=db.invalid\n\n[lhqueue]\n# the fleet's queue\nhost=127.0.0.1\nport={}\ndbname=postgres\nuser=lh_svc\npassword={SECRET}\n",
            pg.port
        ),
        0o600,
    );
    with_env(home.path(), &[], || {
        Queue::connect("service=lhqueue", "svc").expect("service= alone");
        Queue::connect("postgresql://?service=lhqueue", "svc").expect("in a URL");
    });
    with_env(home.path(), &[("PGSERVICE", "lhqueue")], || {
        Queue::connect("postgres://", "svc").expect("PGSERVICE");
    });
    let e = with_env(home.path(), &[], || connect_err("service=nosuch"));
    assert!(e.contains("no service") && e.contains("nosuch"), "{e}");
}
