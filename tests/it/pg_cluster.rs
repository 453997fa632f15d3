//! A throwaway PostgreSQL cluster per test, from Debian's server packages
//! (`scripts/ensure-postgres.sh` installs them; `scripts/test` runs it): `initdb` into a
//! temporary folder, `pg_ctl start` listening only on a Unix socket in that folder (no TCP
//! port, so nothing to collide with), trust authentication for the superuser `codebox`.
//! Dropping the guard (also when the test panics) stops the server by `pg_ctl stop`, then by
//! its PID if that failed, and removes the folder.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does), the server runs
//! as the unprivileged `nobody` through `runuser`, and the folder is handed to `nobody`;
//! as any other user it runs as that user. A test process killed outright cannot drop its
//! guards: the first cluster of the next test process stops and removes any cluster whose
//! test process is gone (folders are named `codebox-pg-<test pid>-<n>`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// The user the server runs as when the tests run as root.
const SERVER_USER: &str = "nobody";
/// The cluster's superuser (trust authentication on its private socket).
pub const SUPERUSER: &str = "codebox";
/// The port number names the socket file (`.s.PGSQL.5432`); nothing listens on TCP.
const PORT: u16 = 5432;
const PREFIX: &str = "codebox-pg-";

pub struct PgCluster {
    /// Owned by the server's user; holds `data/`, the socket and `log`.
    root: PathBuf,
    bin: PathBuf,
    pid: Option<i32>,
    /// Server options beyond the socket-only defaults (TLS: the certificate, a TCP port).
    extra: String,
    /// With TLS: the loopback port it listens on.
    pub tcp_port: Option<u16>,
}

fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server programs (initdb, pg_ctl) are not installed under \
             /usr/lib/postgresql: run scripts/ensure-postgres.sh (apt-get install postgresql)"
        )
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn check(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: cannot start it: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `program args...` in the cluster's folder, as the server's user.
fn as_server_user(program: &Path, root: &Path) -> Command {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", SERVER_USER, "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    c.current_dir(root);
    c
}

/// Start the server of the cluster in `root` and wait until it accepts connections; its PID.
/// Without `extra` options it listens on its socket only.
fn start_server(bin: &Path, root: &Path, extra: &str) -> Option<i32> {
    let data = root.join("data");
    let listen = if extra.is_empty() {
        format!("-c listen_addresses='' -p {PORT}")
    } else {
        extra.to_string()
    };
    let options = format!(
        "-k {} {listen} -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
        root.display()
    );
    check(
        "pg_ctl start",
        as_server_user(&bin.join("pg_ctl"), root)
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(root.join("log"))
            .args(["-o", &options])
            .output(),
    );
    postmaster_pid(&data)
}

fn id_of(flag: &str) -> u32 {
    let out = check("id", Command::new("id").args([flag, SERVER_USER]).output());
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The postmaster's PID, from the first line of `postmaster.pid`.
fn postmaster_pid(data: &Path) -> Option<i32> {
    std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn stop(bin: &Path, root: &Path, pid: Option<i32>) {
    let data = root.join("data");
    let stopped = as_server_user(&bin.join("pg_ctl"), Path::new("/"))
        .args(["stop", "-m", "immediate", "-w", "-t", "30", "-D"])
        .arg(&data)
        .output()
        .is_ok_and(|o| o.status.success());
    if !stopped {
        if let Some(pid) = pid.or_else(|| postmaster_pid(&data)) {
            // SAFETY: kill(2) on the postmaster this guard started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

/// Stop and remove clusters whose test process is gone (it was killed before its guards ran).
fn sweep_stale(bin: &Path) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if owner != std::process::id() as i32 && !process_alive(owner) {
            eprintln!("removing the PostgreSQL test cluster {name} of a test process that is gone");
            stop(bin, &e.path(), None);
        }
    }
}

impl PgCluster {
    /// A fresh cluster, started and accepting connections.
    pub fn start() -> PgCluster {
        static SWEPT: Once = Once::new();
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let bin = bin_dir();
        SWEPT.call_once(|| sweep_stale(&bin));
        let root = std::env::temp_dir().join(format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).unwrap();
        // From here on the guard removes the folder, whatever fails next.
        let mut cluster = PgCluster {
            root: root.clone(),
            bin: bin.clone(),
            pid: None,
            extra: String::new(),
            tcp_port: None,
        };
        if is_root() {
            std::os::unix::fs::chown(&root, Some(id_of("-u")), Some(id_of("-g"))).unwrap();
        }
        let data = root.join("data");
        check(
            "initdb",
            as_server_user(&bin.join("initdb"), &root)
                .args(["--no-sync", "--auth=trust", "--encoding=UTF8", "--locale=C"])
                .args(["-U", SUPERUSER, "-D"])
                .arg(&data)
                .output(),
        );
        cluster.pid = start_server(&bin, &root, "");
        cluster
    }

    /// A fresh cluster that also listens on a loopback TCP port with `ssl = on`, refusing
    /// connections there without TLS, its certificate (for `localhost` only) made by openssl
    /// with a CA of its own ([`PgCluster::ca`]); [`PgCluster::other_ca`] signed nothing.
    pub fn start_tls() -> PgCluster {
        let mut cluster = PgCluster::start();
        cluster.pause();
        let root = cluster.root.clone();
        let openssl = |args: &[&str]| {
            check(
                &format!("openssl {}", args[..2].join(" ")),
                Command::new("openssl")
                    .args(args)
                    .current_dir(&root)
                    .output(),
            )
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, cn) in [("ca", "codebox test CA"), ("other-ca", "codebox other CA")] {
            let (key, pem, subject) = (
                format!("{name}.key"),
                format!("{name}.pem"),
                format!("/CN={cn}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend([
                "-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subject,
            ]);
            args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
            args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
            openssl(&args);
        }
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(&args);
        std::fs::write(
            root.join("server.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        std::fs::write(
            root.join("data/pg_hba.conf"),
            "local all all trust\nhostnossl all all 127.0.0.1/32 reject\n\
             hostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        for file in ["server.key", "server.pem", "data/pg_hba.conf"] {
            let path = root.join(file);
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if is_root() {
                std::os::unix::fs::chown(&path, Some(id_of("-u")), Some(id_of("-g"))).unwrap();
            }
        }
        let port = crate::common::free_port();
        cluster.extra = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c ssl=on -c ssl_cert_file={0}/server.pem \
             -c ssl_key_file={0}/server.key",
            root.display()
        );
        cluster.tcp_port = Some(port);
        cluster.restart();
        cluster
    }

    /// The CA file that signed the server's certificate (TLS clusters).
    pub fn ca(&self) -> PathBuf {
        self.root.join("ca.pem")
    }

    /// A CA file that signed nothing of this cluster's.
    pub fn other_ca(&self) -> PathBuf {
        self.root.join("other-ca.pem")
    }

    /// The URL of database `db` over TCP to `host` (TLS clusters), with `params` as its query.
    pub fn tcp_url(&self, host: &str, db: &str, params: &str) -> String {
        let port = self.tcp_port.expect("a TLS cluster");
        format!("postgres://{SUPERUSER}@{host}:{port}/{db}?{params}")
    }

    /// The URL of database `db` over the cluster's socket, as `history.url` takes it.
    pub fn url(&self, db: &str) -> String {
        let socket_dir = self.root.display().to_string().replace('/', "%2F");
        // The port names the socket file too.
        let port = self.tcp_port.unwrap_or(PORT);
        format!("postgres://{SUPERUSER}@{socket_dir}:{port}/{db}")
    }

    /// Run `f` with a client connected to database `db`, on a thread of its own (the
    /// synchronous client drives a runtime of its own, which cannot run inside a test's).
    pub fn with_client<T: Send>(
        &self,
        db: &str,
        f: impl FnOnce(&mut postgres::Client) -> T + Send,
    ) -> T {
        let url = self.url(db);
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut client = postgres::Client::connect(&url, postgres::NoTls)
                    .unwrap_or_else(|e| panic!("connecting to the test cluster: {e}"));
                f(&mut client)
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Create database `name` and return its URL.
    pub fn create_database(&self, name: &str) -> String {
        self.with_client("postgres", |c| {
            c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap()
        });
        self.url(name)
    }

    /// Stop the server (to test an outage); [`PgCluster::restart`] brings it back.
    pub fn pause(&mut self) {
        check(
            "pg_ctl stop",
            as_server_user(&self.bin.join("pg_ctl"), &self.root)
                .args(["stop", "-m", "fast", "-w", "-D"])
                .arg(self.root.join("data"))
                .output(),
        );
        self.pid = None;
    }

    pub fn restart(&mut self) {
        self.pid = start_server(&self.bin, &self.root, &self.extra);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        stop(&self.bin, &self.root, self.pid);
    }
}
