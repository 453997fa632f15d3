//! A second, private Docker daemon for the tests that must not touch the machine's own: the
//! remote daemon over TLS, and the faults (a daemon killed, stopped, or out of disk).
//!
//! `scripts/private-dockerd.sh` starts it under a folder of its own (data root on a tmpfs,
//! exec root, socket, pid file), in a network namespace of its own (slirp4netns gives it
//! outbound access and forwards the host's `127.0.0.1:PORT` to it: the host's interfaces,
//! routes and iptables rules are never touched), listening on a unix socket and, for the
//! host, on `tcp://127.0.0.1:PORT` with `--tlsverify` (a CA, a server and a client
//! certificate made with openssl). `debian:bookworm-slim` is loaded into it from the machine's daemon, then
//! codebox builds the base and bash images there over TLS. One daemon serves every test of
//! this process, one test at a time ([`private_daemon`] hands out a lock with it): the fault
//! tests kill and stop it.
//!
//! The daemon runs in a mount namespace of its own in which `/tmp` (every test's programs,
//! outputs and data directories) and the repository (`images/`, `languages.toml`, the
//! codebox binary) are empty: like a daemon on another machine, it cannot see codebox's
//! files, so everything that reaches it travels through the Engine API.
//!
//! It is stopped by PID, and its mounts and folder removed, when this process exits
//! (`atexit`), and by a detached keeper process if this process is killed instead.
//!
//! [`owned_daemons`] starts further daemons the same way, each independent and its holder's
//! own ([`OwnedDaemon`]: stopped when dropped, at exit, or by its keeper), listening on their
//! unix socket only, with images loaded from the machine's daemon (one `docker save`
//! archive for all of them) instead of built. [`private_hosts`] keeps three of them for the
//! cluster tests: one Docker host per server.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use codebox::config::DockerSettings;
use tokio::sync::{Mutex, MutexGuard};

use crate::common::{codebox_bin, free_port, root};
use crate::mcp_support::eventually;

/// The images the private daemon gets (built there by codebox).
pub const IMAGES: [&str; 2] = ["base", "bash"];

pub struct PrivateDaemon {
    /// The daemon's own folder (under `/run`).
    pub dir: PathBuf,
    /// Its TLS port on the host's `127.0.0.1`; 0 for an [`OwnedDaemon`] (socket only).
    pub port: u16,
    /// A `languages.toml` with only the languages on its images (bash for the shared one),
    /// beside a link to `images/`.
    pub registry: PathBuf,
}

/// How a codebox process reaches the private daemon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Via {
    /// `DOCKER_HOST=tcp://127.0.0.1:PORT`, `DOCKER_TLS_VERIFY=1`, `DOCKER_CERT_PATH`.
    Tls,
    /// `DOCKER_HOST=unix://DIR/docker.sock`.
    Socket,
}

static LOCK: Mutex<()> = Mutex::const_new(());
static DAEMON: OnceLock<PrivateDaemon> = OnceLock::new();
static STOP_DIR: OnceLock<PathBuf> = OnceLock::new();
/// Every daemon of this process still to stop at exit (the shared one, the owned ones).
static AT_EXIT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
static AT_EXIT_REGISTERED: std::sync::Once = std::sync::Once::new();

fn script() -> PathBuf {
    root().join("scripts/private-dockerd.sh")
}

fn script_run(args: &[&str]) -> Output {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "private-dockerd.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Stop every daemon still running, all at once.
extern "C" fn stop_at_exit() {
    let dirs = AT_EXIT.lock().map(|d| d.clone()).unwrap_or_default();
    let stops: Vec<_> = dirs
        .iter()
        .filter_map(|dir| {
            Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(dir)
                .stdin(Stdio::null())
                .spawn()
                .ok()
        })
        .collect();
    for mut stop in stops {
        let _ = stop.wait();
    }
}

/// Folders for a new daemon: its own (short: its unix sockets live under it; under `/run`,
/// outside what it cannot see), and this process's files for it (hidden from it, removed with
/// it). From now on it is stopped at this process's exit, and by a detached keeper if this
/// process is killed.
fn new_daemon_dirs() -> (PathBuf, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("cbd.")
        .tempdir_in("/run")
        .expect("temp dir")
        .keep();
    let files = tempfile::Builder::new()
        .prefix("cbd-files.")
        .tempdir()
        .expect("temp dir")
        .keep();
    std::fs::write(
        dir.join("also-remove"),
        files.as_os_str().as_encoded_bytes(),
    )
    .unwrap();
    AT_EXIT.lock().unwrap().push(dir.clone());
    // SAFETY: registering a plain function to run at exit.
    AT_EXIT_REGISTERED.call_once(|| unsafe {
        libc::atexit(stop_at_exit);
    });
    // Detached (`--fork`: setsid returns at once), so that it outlives this process.
    Command::new("setsid")
        .arg("--fork")
        .arg("bash")
        .arg(script())
        .arg("keep")
        .arg(&dir)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the keeper");
    (dir, files)
}

/// `private-dockerd.sh start DIR ARGS...`, hiding the temp folder and the repository from the
/// daemon; the host's network interfaces must be the same after.
fn start_daemon(dir: &Path, args: &[&str]) {
    let interfaces = host_interfaces();
    let (tmp, repo) = (std::env::temp_dir(), root());
    let mut all = vec!["start", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend([
        "--hide",
        tmp.to_str().unwrap(),
        "--hide",
        repo.to_str().unwrap(),
    ]);
    script_run(&all);
    assert_eq!(
        host_interfaces(),
        interfaces,
        "starting a private daemon changed the host's network interfaces"
    );
}

/// The host's network interfaces (a second daemon in the host's network namespace started
/// with `--bridge=none` deletes `docker0`, the machine's own daemon's bridge).
fn host_interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .expect("/sys/class/net")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn shipped_registry() -> toml::Table {
    toml::from_str(&std::fs::read_to_string(root().join("languages.toml")).unwrap()).unwrap()
}

/// The shipped registry cut to `languages` and `images`, in `dir`, with `images/` linked.
fn registry(dir: &Path, images: &[&str], languages: &[&str]) -> PathBuf {
    let shipped = shipped_registry();
    let cut = |section: &str, names: &[&str]| -> toml::Table {
        names
            .iter()
            .map(|n| (n.to_string(), shipped[section][*n].clone()))
            .collect()
    };
    let mut table = toml::Table::new();
    table.insert("images".into(), cut("images", images).into());
    table.insert("languages".into(), cut("languages", languages).into());
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::symlink(root().join("images"), dir.join("images")).unwrap();
    let path = dir.join("languages.toml");
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    path
}

impl PrivateDaemon {
    fn start() -> PrivateDaemon {
        let began = Instant::now();
        // One attempt per test process: after a failed start the tests that follow fail at
        // once, without making folders nobody would remove.
        assert!(
            STOP_DIR.get().is_none(),
            "the private daemon failed to start in an earlier test"
        );
        let (dir, files) = new_daemon_dirs();
        STOP_DIR.set(dir.clone()).expect("one private daemon");
        let port = free_port();
        let port_text = port.to_string();
        start_daemon(
            &dir,
            &["--tls", &port_text, "--load", "debian:bookworm-slim"],
        );
        let registry = registry(&files.join("registry"), &IMAGES, &["bash"]);
        let daemon = PrivateDaemon {
            dir,
            port,
            registry,
        };
        daemon.assert_hidden();
        let started = began.elapsed();
        let build = daemon
            .codebox(Via::Tls, &files.join("build-data"))
            .args(["images", "build"])
            .args(IMAGES)
            .args(["--set", "docker.build_network=host"])
            .output()
            .unwrap();
        assert!(
            build.status.success(),
            "codebox images build over TLS: {}",
            String::from_utf8_lossy(&build.stderr)
        );
        eprintln!(
            "private daemon in {}: started in {:.1} s, images built over TLS in {:.1} s",
            daemon.dir.display(),
            started.as_secs_f64(),
            (began.elapsed() - started).as_secs_f64()
        );
        daemon
    }

    /// The daemon's view of the filesystem, through /proc: codebox's files are not there.
    fn assert_hidden(&self) {
        let seen = PathBuf::from(format!("/proc/{}/root", self.pid()));
        assert!(
            seen.join("usr/bin").exists(),
            "the daemon's filesystem is readable through /proc"
        );
        // The repository may lie under the hidden temp folder (a clone in /tmp): then it is
        // not there at all, which hides it just as well.
        let hidden_root = seen.join(root().strip_prefix("/").unwrap());
        assert!(
            !hidden_root.join("languages.toml").exists(),
            "the daemon sees the repository"
        );
        let tmp = seen.join(std::env::temp_dir().strip_prefix("/").unwrap());
        assert_eq!(
            std::fs::read_dir(&tmp).map(|d| d.count()).ok(),
            Some(0),
            "the daemon sees /tmp"
        );
    }

    pub fn socket(&self) -> String {
        format!("unix://{}/docker.sock", self.dir.display())
    }

    pub fn tcp(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// The client certificate folder (`ca.pem`, `cert.pem`, `key.pem`).
    pub fn certs(&self) -> PathBuf {
        self.dir.join("client")
    }

    /// A certificate folder with `ca.pem` only.
    pub fn certs_without_client(&self) -> PathBuf {
        self.dir.join("client-nocert")
    }

    /// The settings an in-process engine connects with.
    pub fn settings(&self, via: Via) -> DockerSettings {
        match via {
            Via::Tls => DockerSettings {
                host: Some(self.tcp()),
                tls_verify: Some(true),
                cert_path: Some(self.certs()),
                ..DockerSettings::default()
            },
            Via::Socket => DockerSettings {
                host: Some(self.socket()),
                ..DockerSettings::default()
            },
        }
    }

    /// The codebox binary on this daemon, with the bash registry and `data_dir`; nothing of
    /// the environment's Docker or codebox settings is inherited.
    pub fn codebox(&self, via: Via, data_dir: &Path) -> Command {
        let mut c = Command::new(codebox_bin());
        c.env("CODEBOX_LANGUAGES", &self.registry)
            .env("CODEBOX_DATA_DIR", data_dir)
            .env_remove("CODEBOX_CONFIG")
            .env_remove("CODEBOX_TOKEN")
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .stdin(Stdio::null());
        match via {
            Via::Tls => c
                .env("DOCKER_HOST", self.tcp())
                .env("DOCKER_TLS_VERIFY", "1")
                .env("DOCKER_CERT_PATH", self.certs()),
            Via::Socket => c.env("DOCKER_HOST", self.socket()),
        };
        c
    }

    /// `codebox run` (through `via`, `--json`, output piped) of a shell program that prints
    /// `started` and sleeps 300 s within a 600 s limit. Returns once the program sleeps in the
    /// run's container (so `started` was written), with that container's id.
    pub async fn start_sleeper(
        &self,
        via: Via,
        data_dir: &Path,
        work: &Path,
    ) -> (std::process::Child, String) {
        let sleeper = work.join("sleep.sh");
        std::fs::write(&sleeper, "echo started\nsleep 300\n").unwrap();
        let child = self
            .codebox(via, data_dir)
            .arg("run")
            .arg(&sleeper)
            .args(["--timeout-seconds", "600", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut container = String::new();
        eventually(
            60,
            "the program sleeps in the run's container",
            || match self.running("label=codebox.managed=true").as_slice() {
                [id] if self.processes(id).contains("sleep 300") => {
                    container = id.clone();
                    true
                }
                _ => false,
            },
        )
        .await;
        (child, container)
    }

    /// `codebox run` (through `via`) of `echo hello`, written to a file in `work`: it must
    /// succeed and print `hello`.
    pub fn run_hello(&self, via: Via, data_dir: &Path, work: &Path) {
        let hello = work.join("hello.sh");
        std::fs::write(&hello, "echo hello\n").unwrap();
        let out = self
            .codebox(via, data_dir)
            .arg("run")
            .arg(&hello)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    }

    /// `docker top`: the processes of a running container.
    pub fn processes(&self, container: &str) -> String {
        String::from_utf8_lossy(&self.docker(&["top", container]).stdout).into_owned()
    }

    /// The docker CLI on this daemon's socket.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .arg("-H")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("docker CLI")
    }

    /// Ids of this daemon's containers matching a `docker ps` filter (running or not).
    pub fn containers(&self, filter: &str) -> Vec<String> {
        let out = self.docker(&["ps", "-aq", "--no-trunc", "--filter", filter]);
        assert!(
            out.status.success(),
            "docker ps: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Running containers matching a filter.
    pub fn running(&self, filter: &str) -> Vec<String> {
        let out = self.docker(&["ps", "-q", "--no-trunc", "--filter", filter]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Containers and volumes matching a `docker` label filter, as
    /// [`crate::common::labelled_objects`] finds them on the machine's daemon.
    pub fn labelled(&self, filter: &str) -> Vec<String> {
        let mut found = self.containers(filter);
        let out = self.docker(&["volume", "ls", "-q", "--filter", filter]);
        assert!(
            out.status.success(),
            "docker volume ls: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string),
        );
        found
    }

    /// Watch this daemon for the managed containers it creates from now on.
    pub fn watch_creations(&self) -> Creations {
        watch_creations(&["-H", &self.socket()])
    }

    /// One label of a container.
    pub fn label(&self, container: &str, label: &str) -> String {
        let format = format!("{{{{index .Config.Labels \"{label}\"}}}}");
        let out = self.docker(&["inspect", "--format", &format, container]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.join("dockerd.pid"))
            .expect("the daemon's pid file")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// Send a signal to the daemon (by its PID).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the private daemon's PID.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0, "kill");
    }

    /// Start the daemon again on the same folders, after a kill; returns once it answers.
    pub fn restart(&self) {
        script_run(&["restart", self.dir.to_str().unwrap()]);
    }

    /// Make the daemon's disk (its tmpfs data root) full, or give it its room back.
    pub fn fill_disk(&self, full: bool) {
        script_run(&[
            if full { "fill" } else { "unfill" },
            self.dir.to_str().unwrap(),
        ]);
    }

    /// The daemon's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }
}

/// The private daemon (started and given its images on first use), and the right to use it
/// alone until the guard is dropped.
pub async fn private_daemon() -> (MutexGuard<'static, ()>, &'static PrivateDaemon) {
    let guard = LOCK.lock().await;
    let daemon = match DAEMON.get() {
        Some(d) => d,
        None => {
            let d = tokio::task::spawn_blocking(PrivateDaemon::start)
                .await
                .expect("the private daemon starts");
            DAEMON.get_or_init(|| d)
        }
    };
    // A test that failed may have left containers: remove them, so its failure is not
    // blamed on the next test.
    let left = daemon.containers("label=codebox.managed=true");
    if !left.is_empty() {
        let mut args = vec!["rm", "-f"];
        args.extend(left.iter().map(String::as_str));
        daemon.docker(&args);
    }
    (guard, daemon)
}

/// Wait (up to `timeout`) for a child to exit; its output.
pub async fn wait_output(child: std::process::Child, timeout: Duration) -> Output {
    let pid = child.id() as i32;
    let waiter = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(timeout, waiter).await {
        Ok(out) => out.unwrap().expect("child output"),
        Err(_) => {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child did not exit within {timeout:?}");
        }
    }
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The lock files of instances under a data directory.
pub fn lock_files(data_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data_dir.join("instances"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The managed containers a daemon creates, as its event stream tells them: `(run,
/// instance)` labels, from the moment of [`watch_creations`] (a daemon keeps only its last
/// 256 events, so a busy one's log read afterwards has lost the first). The `docker events`
/// child is stopped (by its PID) when this is dropped.
pub struct Creations {
    child: std::process::Child,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

/// Watch a daemon (`docker` CLI with `args`: none for the machine's) for managed containers
/// created from now on.
pub fn watch_creations(args: &[&str]) -> Creations {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let mut child = Command::new("docker")
        .args(args)
        // From this instant, replayed from the daemon's log: nothing is missed while the
        // stream connects.
        .args(["events", "--since", &format!("{:.3}", since.as_secs_f64())])
        .args(["--filter", "type=container", "--filter", "event=create"])
        .args(["--filter", "label=codebox.managed=true"])
        .args([
            "--format",
            r#"{{index .Actor.Attributes "codebox.run"}} {{index .Actor.Attributes "codebox.instance"}}"#,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker events");
    let stdout = child.stdout.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = seen.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some((run, instance)) = line.split_once(' ') {
                into.lock()
                    .unwrap()
                    .push((run.to_string(), instance.to_string()));
            }
        }
    });
    Creations { child, seen }
}

impl Creations {
    /// What was created so far (waits a moment for the stream to catch up).
    pub fn so_far(&self) -> Vec<(String, String)> {
        std::thread::sleep(Duration::from_millis(500));
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Creations {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An independent private daemon, its holder's own: stopped (by PID, its mounts and folders
/// removed) when dropped, at this process's exit, or by its keeper if this process is killed.
pub struct OwnedDaemon(PrivateDaemon);

impl std::ops::Deref for OwnedDaemon {
    type Target = PrivateDaemon;
    fn deref(&self) -> &PrivateDaemon {
        &self.0
    }
}

impl Drop for OwnedDaemon {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.0.dir)
            .stdin(Stdio::null())
            .status();
        AT_EXIT.lock().unwrap().retain(|d| d != &self.0.dir);
    }
}

/// `n` independent private daemons (each in network and mount namespaces of its own, as
/// the shared one, listening on its unix socket only), started at once, each with `images`
/// (names in `languages.toml`) loaded from the machine's daemon (one `docker save` archive
/// for all) and a registry of `languages` on them. Prints what the start took.
pub fn owned_daemons(n: usize, images: &[&str], languages: &[&str]) -> Vec<OwnedDaemon> {
    let began = Instant::now();
    let shipped = shipped_registry();
    let tags: Vec<String> = images
        .iter()
        .map(|name| {
            shipped["images"][*name]["tag"]
                .as_str()
                .expect("an image's tag")
                .to_string()
        })
        .collect();
    for tag in &tags {
        let inspect = Command::new("docker")
            .args(["image", "inspect", "--format", "{{.Id}}", tag])
            .output()
            .expect("docker CLI");
        assert!(
            inspect.status.success(),
            "image {tag} is not on the machine's daemon (codebox images build {})",
            images.join(" ")
        );
    }
    let archive = tempfile::Builder::new()
        .prefix("cbd-images.")
        .suffix(".tar")
        .tempfile()
        .expect("temp file");
    let save = Command::new("docker")
        .arg("save")
        .arg("-o")
        .arg(archive.path())
        .args(&tags)
        .output()
        .expect("docker CLI");
    assert!(
        save.status.success(),
        "docker save {tags:?}: {}",
        String::from_utf8_lossy(&save.stderr)
    );
    let saved = began.elapsed();
    let archive_path = archive.path().to_str().unwrap().to_string();
    let daemons: Vec<OwnedDaemon> = std::thread::scope(|scope| {
        let starts: Vec<_> = (0..n)
            .map(|_| {
                let archive = archive_path.as_str();
                scope.spawn(move || {
                    let (dir, files) = new_daemon_dirs();
                    // Owned from here: a failed start below stops it on the way out.
                    let daemon = OwnedDaemon(PrivateDaemon {
                        registry: registry(&files.join("registry"), images, languages),
                        dir,
                        port: 0,
                    });
                    start_daemon(
                        &daemon.dir,
                        &["--data-mb", "1024", "--load-archive", archive],
                    );
                    daemon.assert_hidden();
                    daemon
                })
            })
            .collect();
        starts
            .into_iter()
            .map(|s| s.join().expect("a private daemon starts"))
            .collect()
    });
    eprintln!(
        "{n} private daemons with {tags:?}: images saved in {:.1} s, daemons started and \
         loaded in {:.1} s",
        saved.as_secs_f64(),
        (began.elapsed() - saved).as_secs_f64()
    );
    daemons
}

/// The images and languages of [`private_hosts`]: Bash and AWK (the bash image), Lua.
pub const HOST_IMAGES: [&str; 3] = ["base", "bash", "lua"];
pub const HOST_LANGUAGES: [&str; 3] = ["bash", "awk", "lua"];

static HOSTS_LOCK: Mutex<()> = Mutex::const_new(());
static HOSTS: OnceLock<Vec<OwnedDaemon>> = OnceLock::new();
static HOSTS_TRIED: AtomicBool = AtomicBool::new(false);

/// Three private daemons ([`owned_daemons`] with [`HOST_IMAGES`]), one Docker host per
/// server for the cluster tests: started on first use, kept for every test of this process
/// that asks (one at a time: the guard), stopped at exit. Each is handed out with nothing
/// managed on it.
pub async fn private_hosts() -> (MutexGuard<'static, ()>, &'static [OwnedDaemon]) {
    let guard = HOSTS_LOCK.lock().await;
    let hosts = match HOSTS.get() {
        Some(h) => h,
        None => {
            // One attempt per test process, as for the shared daemon.
            assert!(
                !HOSTS_TRIED.swap(true, Ordering::SeqCst),
                "the private hosts failed to start in an earlier test"
            );
            let h = tokio::task::spawn_blocking(|| owned_daemons(3, &HOST_IMAGES, &HOST_LANGUAGES))
                .await
                .expect("the private hosts start");
            HOSTS.get_or_init(|| h)
        }
    };
    for host in hosts {
        let left = host.containers("label=codebox.managed=true");
        if !left.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(left.iter().map(String::as_str));
            host.docker(&args);
        }
        let out = host.docker(&[
            "volume",
            "prune",
            "-f",
            "--filter",
            "label=codebox.managed=true",
        ]);
        assert!(out.status.success(), "docker volume prune");
    }
    (guard, hosts.as_slice())
}
