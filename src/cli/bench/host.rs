//! The whole host's CPU, read from `/proc` and the cgroup tree, split by who spent it: this
//! process (codebox), its children (the docker CLI of the baseline), the daemons, the
//! containers' shims and runc, the containers themselves, the kernel's threads, and the rest
//! (other users' work on a shared machine). Two snapshots make a [`Cost`].
//!
//! What each figure is, on a Linux host with cgroup v1 and `cgroupfs` (this machine):
//! - `dockerd`, `containerd`: every process of that name, its own CPU and that of the
//!   children it reaped (containerd reaps `containerd-shim-runc-v2 start`);
//! - shims and runc: the `containerd-shim*` processes, with the runc commands they reaped.
//!   A shim lives as long as its container and is then reaped by PID 1, whose reaped-children
//!   total also holds everything else it ever reaped (here: other users' commands), so the
//!   shims are watched instead: a thread reads them every 20 ms and keeps the last figure of
//!   each one gone (what a shim spent after its last reading is missed);
//! - containers: `cpuacct.usage` of Docker's parent cgroup (`runc init`, `codebox-init`, the
//!   program), which keeps the CPU of the containers already removed. On cgroup v2 it is
//!   `usage_usec` of `cpu.stat`: of the parent `/sys/fs/cgroup/docker` with the `cgroupfs`
//!   driver; with the `systemd` driver each container is a `system.slice/docker-<id>.scope`
//!   of its own, removed with it, so the scopes are watched like the shims (the last reading
//!   of each one gone is kept);
//! - kernel threads: the children of `kthreadd` (kworkers: cgroup and mount teardown, I/O);
//! - host: busy time of all CPUs (`/proc/stat`), whoever spent it.
//!
//! Process times come in clock ticks (10 ms): a figure per run is a mean over many runs. The
//! bench's own reading is left out of codebox's figure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Docker's parent cgroup of its containers (cgroup v1, `cgroupfs` driver).
const DOCKER_CPUACCT: &str = "/sys/fs/cgroup/cpuacct/docker/cpuacct.usage";
/// The same on cgroup v2 with the `cgroupfs` driver.
const DOCKER_CPU_STAT_V2: &str = "/sys/fs/cgroup/docker/cpu.stat";
/// Where the `systemd` driver puts each container's scope on cgroup v2.
const SYSTEM_SLICE_V2: &str = "/sys/fs/cgroup/system.slice";

/// CPU spent by each part of the host, cumulative, at one moment.
#[derive(Debug, Clone, Copy)]
pub(super) struct Snapshot {
    at: Instant,
    /// Busy time of all CPUs.
    host: Duration,
    own: Duration,
    children: Duration,
    dockerd: Duration,
    containerd: Duration,
    shims: Duration,
    containers: Option<Duration>,
    kernel: Duration,
    /// CPU this process spent taking snapshots (left out of `own`).
    overhead: Duration,
}

/// CPU spent between two snapshots, by part.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cost {
    pub wall: Duration,
    pub host: Duration,
    /// This process: codebox (the bench drives it in process).
    pub own: Duration,
    /// This process's children: the docker CLI.
    pub children: Duration,
    pub dockerd: Duration,
    pub containerd: Duration,
    pub shims: Duration,
    pub containers: Option<Duration>,
    pub kernel: Duration,
}

impl Cost {
    /// What the parts above account for.
    pub(super) fn accounted(&self) -> Duration {
        self.own
            + self.children
            + self.dockerd
            + self.containerd
            + self.shims
            + self.containers.unwrap_or_default()
            + self.kernel
    }

    pub(crate) fn add(&mut self, o: &Cost) {
        self.wall += o.wall;
        self.host += o.host;
        self.own += o.own;
        self.children += o.children;
        self.dockerd += o.dockerd;
        self.containerd += o.containerd;
        self.shims += o.shims;
        self.containers = match (self.containers, o.containers) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.kernel += o.kernel;
    }
}

fn rusage(who: libc::c_int) -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(who, &mut u) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, (tv.tv_usec * 1000) as u32);
    t(u.ru_utime) + t(u.ru_stime)
}

/// This process's CPU time so far.
fn own_cpu() -> Duration {
    rusage(libc::RUSAGE_SELF)
}

fn ticks(n: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(n.saturating_mul(1_000_000_000) / hz)
}

/// Busy ticks of all CPUs: everything but idle and iowait.
fn host_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return Duration::ZERO;
    };
    let v: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let busy: u64 = v.iter().take(8).sum::<u64>()
        - v.get(3).copied().unwrap_or(0)
        - v.get(4).copied().unwrap_or(0);
    ticks(busy)
}

/// One process's line of `/proc/PID/stat`: (name, parent, own ticks, reaped children's ticks).
fn proc_stat(pid: &str) -> Option<(String, u64, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let name = s[open + 1..close].to_string();
    let f: Vec<&str> = s[close + 1..].split_whitespace().collect();
    // After the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    // utime stime cutime cstime.
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    Some((name, n(1), n(11) + n(12), n(13) + n(14)))
}

/// `usage_usec` of a cgroup v2 `cpu.stat`.
fn cpu_stat_usage(text: &str) -> Option<Duration> {
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_micros)
}

/// Whether this host has the unified cgroup v2 hierarchy.
fn cgroup_v2() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The containers' CPU: v1's parent cgroup, v2's parent cgroup, else (v2, `systemd` driver)
/// the watched scopes.
fn containers_cpu(shims: &Shims) -> Option<Duration> {
    if let Some(ns) = std::fs::read_to_string(DOCKER_CPUACCT)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    {
        return Some(Duration::from_nanos(ns));
    }
    if let Some(d) = std::fs::read_to_string(DOCKER_CPU_STAT_V2)
        .ok()
        .and_then(|t| cpu_stat_usage(&t))
    {
        return Some(d);
    }
    cgroup_v2().then(|| shims.scopes_total())
}

/// CPU of each live `docker-<id>.scope` under `dir`, keyed by its name.
fn read_scopes(dir: &str) -> HashMap<String, Duration> {
    let mut scopes = HashMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("docker-") && name.ends_with(".scope") {
            if let Some(d) = std::fs::read_to_string(e.path().join("cpu.stat"))
                .ok()
                .and_then(|t| cpu_stat_usage(&t))
            {
                scopes.insert(name, d);
            }
        }
    }
    scopes
}

impl Snapshot {
    /// Read every figure now. Its own CPU is counted apart, so that [`Cost::own`] is what
    /// codebox spent.
    fn take(overhead_so_far: Duration, shims: &Shims) -> Snapshot {
        let before = own_cpu();
        let shim_ticks = shims.total();
        let (mut dockerd, mut containerd, mut kernel) = (0, 0, 0);
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let pid = e.file_name();
                let Some(pid) = pid
                    .to_str()
                    .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let Some((name, ppid, own, reaped)) = proc_stat(pid) else {
                    continue;
                };
                match name.as_str() {
                    "dockerd" => dockerd += own + reaped,
                    "containerd" => containerd += own + reaped,
                    _ if pid == "2" || ppid == 2 => kernel += own,
                    _ => {}
                }
            }
        }
        let snapshot = Snapshot {
            at: Instant::now(),
            host: host_busy(),
            own: Duration::ZERO,
            children: rusage(libc::RUSAGE_CHILDREN),
            dockerd: ticks(dockerd),
            containerd: ticks(containerd),
            shims: ticks(shim_ticks),
            containers: containers_cpu(shims),
            kernel: ticks(kernel),
            overhead: Duration::ZERO,
        };
        let after = own_cpu();
        let overhead = overhead_so_far + after.saturating_sub(before) + shims.cpu();
        Snapshot {
            own: before.saturating_sub(overhead_so_far),
            overhead,
            ..snapshot
        }
    }

    /// What was spent from `earlier` to this snapshot.
    pub fn since(&self, earlier: &Snapshot) -> Cost {
        Cost {
            wall: self.at.duration_since(earlier.at),
            host: self.host.saturating_sub(earlier.host),
            own: self.own.saturating_sub(earlier.own),
            children: self.children.saturating_sub(earlier.children),
            dockerd: self.dockerd.saturating_sub(earlier.dockerd),
            containerd: self.containerd.saturating_sub(earlier.containerd),
            shims: self.shims.saturating_sub(earlier.shims),
            containers: self
                .containers
                .zip(earlier.containers)
                .map(|(a, b)| a.saturating_sub(b)),
            kernel: self.kernel.saturating_sub(earlier.kernel),
        }
    }

    /// CPU this process has spent taking snapshots so far.
    pub(crate) fn overhead(&self) -> Duration {
        self.overhead
    }
}

/// The shims, watched: their CPU, the gone ones' included.
#[derive(Default)]
struct ShimState {
    /// Ticks of each live shim at its last reading.
    live: HashMap<u32, u64>,
    /// Ticks of the shims gone, at their last reading.
    gone: u64,
    /// Names of PID 1's children seen so far (a pid's name does not change but at exec).
    names: HashMap<u32, String>,
    /// This process's CPU spent watching.
    cpu: Duration,
    /// cgroup v2 with the `systemd` driver: each container scope's CPU at its last reading.
    scopes: HashMap<String, Duration>,
    /// The scopes gone, at their last reading.
    scopes_gone: Duration,
}

#[derive(Default)]
struct Shims {
    state: Mutex<ShimState>,
    stop: AtomicBool,
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes into the struct we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

impl Shims {
    fn lock(&self) -> std::sync::MutexGuard<'_, ShimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Read every shim now (PID 1's children named `containerd-shim*`).
    fn poll(&self) {
        let began = thread_cpu();
        let mut children = Vec::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/1/task") {
            for t in tasks.flatten() {
                let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                children.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
        let mut st = self.lock();
        let mut seen = HashMap::new();
        for pid in children {
            let name = st.names.entry(pid).or_insert_with(|| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            });
            if name.starts_with("containerd-shim") {
                if let Some((_, _, own, reaped)) = proc_stat(&pid.to_string()) {
                    seen.insert(pid, own + reaped);
                }
            }
        }
        let gone: u64 = st
            .live
            .iter()
            .filter(|(pid, _)| !seen.contains_key(pid))
            .map(|(_, t)| *t)
            .sum();
        st.gone += gone;
        st.names
            .retain(|pid, _| seen.contains_key(pid) || pid_alive(*pid));
        st.live = seen;
        if cgroup_v2() {
            let scopes = read_scopes(SYSTEM_SLICE_V2);
            let gone: Duration = st
                .scopes
                .iter()
                .filter(|(name, _)| !scopes.contains_key(*name))
                .map(|(_, d)| *d)
                .sum();
            st.scopes_gone += gone;
            st.scopes = scopes;
        }
        st.cpu += thread_cpu().saturating_sub(began);
    }

    /// The containers' CPU from their scopes (cgroup v2, `systemd` driver), the gone ones'
    /// included.
    fn scopes_total(&self) -> Duration {
        let st = self.lock();
        st.scopes_gone + st.scopes.values().sum::<Duration>()
    }

    fn total(&self) -> u64 {
        self.poll();
        let st = self.lock();
        st.gone + st.live.values().sum::<u64>()
    }

    fn cpu(&self) -> Duration {
        std::mem::take(&mut self.lock().cpu)
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Takes snapshots and keeps their own CPU out of codebox's. Watches the shims from a thread
/// of its own until dropped.
pub(super) struct Meter {
    overhead: Duration,
    shims: Arc<Shims>,
}

impl Default for Meter {
    fn default() -> Meter {
        let shims = Arc::new(Shims::default());
        let watched = shims.clone();
        std::thread::spawn(move || {
            while !watched.stop.load(Ordering::Relaxed) {
                watched.poll();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Meter {
            overhead: Duration::ZERO,
            shims,
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.shims.stop.store(true, Ordering::Relaxed);
    }
}

impl Meter {
    pub(crate) fn snapshot(&mut self) -> Snapshot {
        let s = Snapshot::take(self.overhead, &self.shims);
        self.overhead = s.overhead();
        s
    }
}

/// The load averages (1, 5, 15 minutes), as `uptime` shows them.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU that nothing of the host's busy time was spent on by the parts above, per second
/// of wall time, over a quiet `window`: what other users of the machine spend meanwhile.
pub async fn background(meter: &mut Meter, window: Duration) -> Cost {
    let a = meter.snapshot();
    tokio::time::sleep(window).await;
    meter.snapshot().since(&a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_cpu_is_read_from_cgroup_v2s_cpu_stat() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n";
        assert_eq!(cpu_stat_usage(stat), Some(Duration::from_micros(1_234_567)));
        assert_eq!(cpu_stat_usage("user_usec 1\n"), None);
        let dir = tempfile::tempdir().unwrap();
        for (name, usec) in [
            ("docker-abc.scope", 5),
            ("docker-def.scope", 7),
            ("cron.service", 100),
        ] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(
                dir.path().join(name).join("cpu.stat"),
                format!("usage_usec {usec}\n"),
            )
            .unwrap();
        }
        let scopes = read_scopes(dir.path().to_str().unwrap());
        assert_eq!(scopes.len(), 2, "{scopes:?}");
        assert_eq!(scopes.values().sum::<Duration>(), Duration::from_micros(12));
    }

    #[test]
    fn on_any_cgroup_version_the_containers_cpu_is_measured() {
        // This host's own layout: v1's cpuacct, v2's parent cgroup or v2's scopes.
        let v1 = std::path::Path::new(DOCKER_CPUACCT).exists();
        if v1 || cgroup_v2() {
            assert!(containers_cpu(&Shims::default()).is_some());
        }
    }

    #[test]
    fn cpu_this_process_spends_shows_in_it_and_in_the_host() {
        let mut m = Meter::default();
        let a = m.snapshot();
        let start = own_cpu();
        let mut x = 0u64;
        while own_cpu() < start + Duration::from_millis(300) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let c = m.snapshot().since(&a);
        // Less what the bench's own reading took.
        assert!(c.own >= Duration::from_millis(250), "{c:?}");
        // The host's figure is sampled in clock ticks: most of it, at least.
        assert!(c.host >= Duration::from_millis(200), "{c:?}");
        assert!(c.accounted() >= c.own, "{c:?}");
    }
}
