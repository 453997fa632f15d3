//! The locked-down container spec: built in one function, re-checked before every create.
//!
//! # Security
//! [`locked_down`] is the only place a [`ContainerSpec`] is made. What varies between
//! containers is a [`Plan`]: the image, the sandbox user, memory, CPU, the working directory's
//! size and labels; everything else is fixed here. [`check`] runs right before each create
//! (and before a pre-started container is handed to a run) and refuses any spec that lost a
//! guarantee, so a bug elsewhere turns into a `sandbox_error`, never a weaker run.

use std::collections::BTreeMap;

use super::{ContainerSpec, Resources, CPU_PERIOD_US};
use crate::config::SandboxSettings;

/// The one command every container runs: codebox's waiting step (`images/base/codebox-init.c`,
/// protocol in `docs/sandbox-init.md`). It is PID 1.
const INIT: &str = "/usr/local/bin/codebox-init";
/// The working directory: a size-capped tmpfs, writable, the only place programs may execute.
pub(crate) const WORKSPACE: &str = "/workspace";
/// Scratch space: a size-capped noexec tmpfs.
pub(crate) const SCRATCH: &str = "/tmp";
/// The first of the sandbox users every image creates (`sandbox`, then `sandbox2` ...): a
/// fact about the images (`images/base/Dockerfile`), relied on by the posture check and the
/// uid leases.
pub(super) const SANDBOX_UID_FIRST: u32 = 10001;
/// How many sandbox users the images create: each container gets its own.
pub(super) const SANDBOX_UIDS: u32 = 64;
/// The only environment the container has. The language's `env` reaches the program through
/// the payload (`docs/sandbox-init.md`).
const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a container codebox lets out finds the egress proxy's socket directory (mounted
/// read-only); the relay in codebox-init carries the container's loopback connections there.
pub(crate) const EGRESS_MOUNT: &str = "/run/codebox-egress";
/// The container's own loopback address where the relay listens (`HTTP_PROXY` points here).
const EGRESS_LISTEN: &str = "127.0.0.1:3128";
/// The variable that starts codebox-init's relay (`images/base/codebox-init-egress.c`).
const EGRESS_ENV: &str = "CODEBOX_EGRESS";
/// The proxy as the container's programs see it.
pub(crate) const EGRESS_PROXY_URL: &str = "http://127.0.0.1:3128";
/// The proxy socket's name in its directory.
const EGRESS_SOCKET: &str = "proxy.sock";

/// Memory and CPU of one container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_mb: u64,
    pub cpus: f64,
}

impl Limits {
    /// The engine's view of these limits (swap is always equal to memory: none).
    pub fn resources(&self) -> Resources {
        Resources {
            memory_bytes: (self.memory_mb as i64) * 1024 * 1024,
            cpu_quota_us: ((self.cpus * CPU_PERIOD_US as f64).round() as i64).max(1000),
            cpu_period_us: CPU_PERIOD_US,
        }
    }
}

/// What varies between containers.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Container name, unique (codebox-<run id>-run, codebox-pool-<id>).
    pub name: String,
    /// Image tag.
    pub image: String,
    /// The sandbox user (and group) the container runs as.
    pub uid: u32,
    pub limits: Limits,
    /// Size of the working directory's tmpfs, in MB.
    pub workspace_mb: u64,
    pub labels: BTreeMap<String, String>,
}

/// Size of the `/tmp` and `/dev/shm` tmpfs of a container: the operator's cap, never more
/// than its memory (the pages count against it).
fn scratch_mb(sandbox: &SandboxSettings, limits: &Limits) -> u64 {
    sandbox.tmpfs_mb.min(limits.memory_mb.max(1))
}

/// Build the locked-down spec for one container.
pub fn locked_down(plan: &Plan, sandbox: &SandboxSettings) -> ContainerSpec {
    let env = BTreeMap::from([
        ("PATH".to_string(), BASE_PATH.to_string()),
        ("HOME".to_string(), SCRATCH.to_string()),
        ("TMPDIR".to_string(), SCRATCH.to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    let resources = plan.limits.resources();
    let scratch = scratch_mb(sandbox, &plan.limits);
    let file_size = (sandbox.max_file_size_mb as i64) * 1024 * 1024;
    ContainerSpec {
        name: plan.name.clone(),
        image: plan.image.clone(),
        cmd: vec![INIT.to_string()],
        env,
        user: format!("{0}:{0}", plan.uid),
        working_dir: WORKSPACE.to_string(),
        labels: plan.labels.clone(),
        runtime: sandbox.runtime.clone(),
        network_mode: "none".to_string(),
        readonly_rootfs: true,
        cap_drop: vec!["ALL".to_string()],
        security_opt: vec![
            "no-new-privileges".to_string(),
            super::seccomp::security_opt().to_string(),
        ],
        privileged: false,
        pids_limit: sandbox.pids_limit,
        memory_bytes: resources.memory_bytes,
        memory_swap_bytes: resources.memory_bytes,
        cpu_quota_us: resources.cpu_quota_us,
        cpu_period_us: resources.cpu_period_us,
        tmpfs: BTreeMap::from([
            (
                SCRATCH.to_string(),
                format!("rw,noexec,nosuid,nodev,size={scratch}m,mode=1777"),
            ),
            (
                WORKSPACE.to_string(),
                format!(
                    "rw,exec,nosuid,nodev,size={}m,uid={1},gid={1},mode=0755",
                    plan.workspace_mb, plan.uid
                ),
            ),
        ]),
        shm_bytes: (scratch as i64) * 1024 * 1024,
        ulimits: vec![
            ("fsize".to_string(), file_size),
            ("nofile".to_string(), 1024),
            ("core".to_string(), 0),
        ],
        open_stdin: true,
        init: false,
        volumes: Vec::new(),
        egress: None,
    }
}

/// Give a container the way out through the egress proxy whose socket is in `dir`: the
/// directory mounted read-only at [`EGRESS_MOUNT`], the relay started by `EGRESS_ENV`, and
/// the proxy variables curl, pip, npm, requests and urllib read. `no_proxy`: names the
/// program reaches inside its own container without the proxy (`NO_PROXY`).
pub(crate) fn with_egress(spec: &mut ContainerSpec, dir: &std::path::Path, no_proxy: Option<&str>) {
    spec.egress = Some(dir.to_string_lossy().into_owned());
    spec.env.insert(
        EGRESS_ENV.to_string(),
        format!("{EGRESS_LISTEN}={EGRESS_MOUNT}/{EGRESS_SOCKET}"),
    );
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        spec.env.insert(k.to_string(), EGRESS_PROXY_URL.to_string());
    }
    if let Some(n) = no_proxy {
        spec.env.insert("NO_PROXY".to_string(), n.to_string());
        spec.env.insert("no_proxy".to_string(), n.to_string());
    }
}

/// The egress directory is one codebox made for a proxy: a real directory (no link), mode
/// 0711, holding nothing but the proxy's socket.
fn egress_dir_problem(dir: &str) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = std::path::Path::new(dir);
    if !path.is_absolute()
        || path.components().any(|c| {
            !matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
    {
        return Some(format!(
            "the egress directory {dir} is not an absolute, plain path"
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && m.permissions().mode() & 0o7777 == 0o711 => {}
        Ok(_) => return Some(format!("{dir} is not a directory of mode 0711")),
        Err(e) => return Some(format!("the egress directory {dir}: {e}")),
    }
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) => return Some(format!("the egress directory {dir}: {e}")),
    };
    for e in entries.flatten() {
        let socket = e.file_type().is_ok_and(|t| t.is_socket());
        if e.file_name() != EGRESS_SOCKET || !socket {
            return Some(format!(
                "the egress directory {dir} holds {:?}, not only the proxy's socket",
                e.file_name()
            ));
        }
    }
    None
}

/// A guarantee a spec lost.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("refusing to create a container whose spec is weaker than the sandbox posture: {0}")]
pub struct PostureViolation(pub String);

/// The size option of a tmpfs, in MB.
fn tmpfs_size_mb(opts: &[&str]) -> Option<u64> {
    opts.iter()
        .find_map(|o| o.strip_prefix("size="))
        .and_then(|s| s.strip_suffix('m'))
        .and_then(|s| s.parse().ok())
}

/// Prefix of the names of the volumes holding installed packages (SPEC 13).
pub(crate) const PACKAGES_VOLUME_PREFIX: &str = "codebox-pkg-";

/// What a container is for, as far as the posture check cares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Role<'a> {
    /// A run, compile or session container: no network; volumes only read-only prefixes.
    Run,
    /// An install container: no volume, its own runtime, the install's egress proxy.
    Install { runtime: &'a str },
    /// A container created only to copy installed prefixes, never started: the volumes it
    /// copies into writable, at most one it copies from read-only.
    Copy,
}

/// The install container's spec: the posture of every container (no network), under
/// `runtime`, its way out the install's egress proxy in `egress`.
pub fn install(
    plan: &Plan,
    sandbox: &SandboxSettings,
    runtime: &str,
    egress: &std::path::Path,
) -> ContainerSpec {
    let mut spec = locked_down(plan, sandbox);
    spec.runtime = runtime.to_string();
    with_egress(&mut spec, egress, None);
    spec
}

/// The spec of a container that only copies installed prefixes into and out of `volumes`
/// through the engine's archive calls and is removed without ever starting.
pub(crate) fn copier(
    plan: &Plan,
    sandbox: &SandboxSettings,
    volumes: Vec<super::VolumeMount>,
) -> ContainerSpec {
    let mut spec = locked_down(plan, sandbox);
    spec.open_stdin = false;
    spec.volumes = volumes;
    spec
}

/// Mount a packages prefix volume read-only into a run's spec.
pub(crate) fn with_prefix(spec: &mut ContainerSpec, volume: &str, target: &str) {
    spec.volumes.push(super::VolumeMount {
        volume: volume.to_string(),
        target: target.to_string(),
        read_only: true,
    });
}

/// Re-verify every critical flag of a spec against the operator's sandbox settings. Called
/// right before each create and before a pre-started container serves a run.
pub fn check(spec: &ContainerSpec, sandbox: &SandboxSettings) -> Result<(), PostureViolation> {
    check_as(spec, sandbox, Role::Run)
}

/// [`check`] for a container of the given role.
pub(crate) fn check_as(
    spec: &ContainerSpec,
    sandbox: &SandboxSettings,
    role: Role<'_>,
) -> Result<(), PostureViolation> {
    let fail = |m: String| Err(PostureViolation(m));
    for v in &spec.volumes {
        let dots = v.target.split('/').any(|c| c == ".." || c == ".");
        if !v.volume.starts_with(PACKAGES_VOLUME_PREFIX) || !v.target.starts_with("/opt/") || dots {
            return fail(format!(
                "volume {} at {} is not an installed packages prefix under /opt",
                v.volume, v.target
            ));
        }
        match role {
            Role::Run if !v.read_only => {
                return fail(format!("the packages volume {} is writable", v.volume))
            }
            Role::Install { .. } => {
                return fail("an install container gets no volume".into());
            }
            _ => {}
        }
    }
    for (i, a) in spec.volumes.iter().enumerate() {
        let inside = |outer: &str, inner: &str| {
            inner == outer || inner.starts_with(&format!("{}/", outer.trim_end_matches('/')))
        };
        if let Some(b) = spec.volumes[i + 1..]
            .iter()
            .find(|b| inside(&a.target, &b.target) || inside(&b.target, &a.target))
        {
            return fail(format!(
                "the volumes {} and {} overlap at {} and {}",
                a.volume, b.volume, a.target, b.target
            ));
        }
    }
    if role == Role::Copy {
        let writable = spec.volumes.iter().filter(|v| !v.read_only).count();
        if writable == 0 || spec.volumes.len() - writable > 1 || spec.open_stdin {
            return fail(
                "a copier has a volume to copy into, at most one to copy from, and no stdin".into(),
            );
        }
    }
    let runtime = match role {
        Role::Install { runtime } => runtime,
        _ => sandbox.runtime.as_str(),
    };
    match (&spec.egress, role) {
        (None, Role::Install { .. }) => {
            return fail("an install container without its egress proxy".into())
        }
        (Some(_), Role::Copy) => return fail("a copier gets no egress".into()),
        (Some(_), Role::Run) if sandbox.egress_hosts.is_empty() => {
            return fail("an egress mount, but sandbox.egress_hosts is empty".into())
        }
        (Some(dir), _) => {
            if let Some(problem) = egress_dir_problem(dir) {
                return fail(problem);
            }
            let want = format!("{EGRESS_LISTEN}={EGRESS_MOUNT}/{EGRESS_SOCKET}");
            if spec.env.get(EGRESS_ENV) != Some(&want) {
                return fail(format!("{EGRESS_ENV} is not {want}"));
            }
        }
        (None, _) => {}
    }
    if spec.cmd != [INIT] {
        return fail(format!(
            "the command is {:?}, not codebox's waiting step {INIT}",
            spec.cmd
        ));
    }
    if spec.init {
        return fail("another init would take PID 1 from codebox-init".into());
    }
    if spec.runtime != runtime {
        return fail(format!(
            "the runtime is `{}`, not the configured `{runtime}`",
            spec.runtime
        ));
    }
    if spec.network_mode != "none" {
        return fail(format!(
            "network mode is `{}`, not `none`",
            spec.network_mode
        ));
    }
    if !spec.readonly_rootfs {
        return fail("root filesystem is writable".into());
    }
    let user = spec.user.trim();
    let uid = user.split(':').next().unwrap_or("");
    let sandbox_users = SANDBOX_UID_FIRST..SANDBOX_UID_FIRST + SANDBOX_UIDS;
    if !uid.parse::<u32>().is_ok_and(|u| sandbox_users.contains(&u)) {
        return fail(format!(
            "user `{user}` is not one of the sandbox users ({}..{})",
            sandbox_users.start,
            sandbox_users.end - 1
        ));
    }
    if spec.cap_drop != ["ALL"] {
        return fail(format!(
            "capabilities dropped are {:?}, not [\"ALL\"]",
            spec.cap_drop
        ));
    }
    if !spec
        .security_opt
        .iter()
        .any(|o| o == "no-new-privileges" || o == "no-new-privileges:true")
    {
        return fail("no-new-privileges is not set".into());
    }
    let seccomp: Vec<&String> = spec
        .security_opt
        .iter()
        .filter(|o| o.starts_with("seccomp"))
        .collect();
    if seccomp.len() != 1 || seccomp[0] != super::seccomp::security_opt() {
        return fail("the seccomp profile is not codebox's own".into());
    }
    if spec.security_opt.iter().any(|o| o.contains("unconfined")) {
        return fail(format!(
            "security options weaken confinement: {:?}",
            spec.security_opt
        ));
    }
    if spec.privileged {
        return fail("privileged mode".into());
    }
    if spec.pids_limit <= 0 || spec.pids_limit > sandbox.pids_limit {
        return fail(format!(
            "pids limit is {}, not within 1..={}",
            spec.pids_limit, sandbox.pids_limit
        ));
    }
    if spec.memory_bytes <= 0 {
        return fail("no memory limit".into());
    }
    if spec.memory_swap_bytes != spec.memory_bytes {
        return fail("swap is allowed (memory+swap differs from memory)".into());
    }
    if spec.cpu_quota_us <= 0 || spec.cpu_period_us <= 0 {
        return fail("no CPU quota".into());
    }
    if spec.shm_bytes <= 0 || spec.shm_bytes > spec.memory_bytes {
        return fail(format!(
            "/dev/shm size {} is not within the memory limit",
            spec.shm_bytes
        ));
    }
    let memory_mb = (spec.memory_bytes / (1024 * 1024)) as u64;
    for (path, opts) in &spec.tmpfs {
        let opts: Vec<&str> = opts.split(',').collect();
        let required: &[&str] = if path == WORKSPACE {
            &["nosuid", "nodev"]
        } else {
            &["noexec", "nosuid", "nodev"]
        };
        for r in required {
            if !opts.contains(r) {
                return fail(format!("tmpfs {path} lacks {r}"));
            }
        }
        match tmpfs_size_mb(&opts) {
            Some(size) if size > 0 && size <= memory_mb => {}
            Some(size) => {
                return fail(format!(
                    "tmpfs {path} of {size} MB is not within the memory limit ({memory_mb} MB)"
                ))
            }
            None => return fail(format!("tmpfs {path} has no size cap in MB")),
        }
    }
    for required in [SCRATCH, WORKSPACE] {
        if !spec.tmpfs.contains_key(required) {
            return fail(format!("no size-capped tmpfs at {required}"));
        }
    }
    if !spec.ulimits.iter().any(|(n, v)| n == "fsize" && *v > 0) {
        return fail("no file size limit".into());
    }
    if spec.env.keys().any(|k| k == "DOCKER_HOST") {
        return fail("DOCKER_HOST is in the environment".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            name: "c1".into(),
            image: "img".into(),
            uid: 10001,
            limits: Limits {
                memory_mb: 256,
                cpus: 1.0,
            },
            workspace_mb: 64,
            labels: BTreeMap::new(),
        }
    }

    fn spec() -> ContainerSpec {
        locked_down(&plan(), &SandboxSettings::default())
    }

    #[test]
    fn locked_down_spec_passes_the_posture_check() {
        let s = spec();
        check(&s, &SandboxSettings::default()).unwrap();
        assert_eq!(s.network_mode, "none");
        assert_eq!(s.memory_bytes, s.memory_swap_bytes);
        assert_eq!(s.user, "10001:10001");
        assert_eq!(s.cmd, [INIT]);
        assert_eq!((s.cpu_quota_us, s.cpu_period_us), (100_000, 100_000));
        assert!(s.tmpfs["/tmp"].contains("noexec"));
        assert!(s.tmpfs["/workspace"].contains("size=64m"));
    }

    type Weakening = Box<dyn Fn(&mut ContainerSpec)>;

    #[test]
    fn every_weakened_flag_is_refused() {
        let weakenings: Vec<(&str, Weakening)> = vec![
            ("command", Box::new(|s| s.cmd = vec!["sh".into()])),
            ("docker init", Box::new(|s| s.init = true)),
            ("runtime", Box::new(|s| s.runtime = "other".into())),
            ("network", Box::new(|s| s.network_mode = "bridge".into())),
            ("rootfs", Box::new(|s| s.readonly_rootfs = false)),
            ("root user", Box::new(|s| s.user = "0:0".into())),
            ("root name", Box::new(|s| s.user = "root".into())),
            ("empty user", Box::new(|s| s.user = String::new())),
            ("host user", Box::new(|s| s.user = "1000:1000".into())),
            ("cap_drop", Box::new(|s| s.cap_drop.clear())),
            (
                "nnp",
                Box::new(|s| s.security_opt.retain(|o| o.starts_with("seccomp"))),
            ),
            (
                "no seccomp",
                Box::new(|s| s.security_opt.retain(|o| !o.starts_with("seccomp"))),
            ),
            (
                "seccomp unconfined",
                Box::new(|s| s.security_opt[1] = "seccomp=unconfined".into()),
            ),
            ("shm", Box::new(|s| s.shm_bytes = s.memory_bytes * 2)),
            ("privileged", Box::new(|s| s.privileged = true)),
            ("pids", Box::new(|s| s.pids_limit = 0)),
            ("more pids", Box::new(|s| s.pids_limit = 100_000)),
            ("memory", Box::new(|s| s.memory_bytes = 0)),
            ("swap", Box::new(|s| s.memory_swap_bytes = -1)),
            ("cpu", Box::new(|s| s.cpu_quota_us = 0)),
            (
                "tmpfs exec",
                Box::new(|s| {
                    s.tmpfs.insert("/tmp".into(), "rw,size=64m".into());
                }),
            ),
            (
                "another exec tmpfs",
                Box::new(|s| {
                    s.tmpfs
                        .insert("/var/x".into(), "rw,exec,nosuid,nodev,size=1m".into());
                }),
            ),
            (
                "suid workspace",
                Box::new(|s| {
                    s.tmpfs
                        .insert("/workspace".into(), "rw,exec,nodev,size=64m".into());
                }),
            ),
            (
                "workspace over memory",
                Box::new(|s| {
                    s.tmpfs.insert(
                        "/workspace".into(),
                        "rw,exec,nosuid,nodev,size=4096m".into(),
                    );
                }),
            ),
            (
                "uncapped workspace",
                Box::new(|s| {
                    s.tmpfs
                        .insert("/workspace".into(), "rw,exec,nosuid,nodev".into());
                }),
            ),
            ("no tmpfs", Box::new(|s| s.tmpfs.clear())),
            ("fsize", Box::new(|s| s.ulimits.clear())),
            (
                "docker host",
                Box::new(|s| {
                    s.env.insert("DOCKER_HOST".into(), "tcp://x".into());
                }),
            ),
        ];
        for (name, weaken) in weakenings {
            let mut s = spec();
            weaken(&mut s);
            assert!(
                check(&s, &SandboxSettings::default()).is_err(),
                "{name} was accepted"
            );
        }
    }

    #[test]
    fn only_a_read_only_prefix_volume_and_no_network_pass() {
        let sandbox = SandboxSettings::default();
        let mut run = spec();
        with_prefix(&mut run, "codebox-pkg-abc", "/opt/codebox/packages");
        check(&run, &sandbox).unwrap();
        run.volumes[0].read_only = false;
        assert!(check(&run, &sandbox).is_err(), "a writable prefix ran");
        let mut other = spec();
        with_prefix(&mut other, "somebody-else", "/opt/x");
        assert!(check(&other, &sandbox).is_err());
        let mut etc = spec();
        with_prefix(&mut etc, "codebox-pkg-abc", "/etc");
        assert!(check(&etc, &sandbox).is_err());

        let dir = egress_dir();
        let role = Role::Install { runtime: "runc" };
        let inst = install(&plan(), &sandbox, "runc", dir.path());
        check_as(&inst, &sandbox, role).unwrap();
        assert_eq!(inst.network_mode, "none");
        assert_eq!(
            inst.env[EGRESS_ENV],
            "127.0.0.1:3128=/run/codebox-egress/proxy.sock"
        );
        assert_eq!(inst.env["HTTPS_PROXY"], "http://127.0.0.1:3128");
        let mut other_runtime = inst.clone();
        other_runtime.runtime = "weird".into();
        assert!(check_as(&other_runtime, &sandbox, role).is_err());
        assert!(
            check(&inst, &sandbox).is_err(),
            "a run container got an egress without sandbox.egress_hosts"
        );
        for wrong in ["bridge", "host", "", "codebox-install-x"] {
            let mut s = inst.clone();
            s.network_mode = wrong.into();
            assert!(check_as(&s, &sandbox, role).is_err(), "{wrong}");
        }
        let mut no_egress = inst.clone();
        no_egress.egress = None;
        assert!(check_as(&no_egress, &sandbox, role).is_err());
        let mut with_vol = inst.clone();
        with_prefix(&mut with_vol, "codebox-pkg-abc", "/opt/codebox/packages");
        assert!(check_as(&with_vol, &sandbox, role).is_err());
    }

    #[test]
    fn a_copier_copies_into_a_prefix_volume_from_at_most_one_and_never_nests_them() {
        let sandbox = SandboxSettings::default();
        let mount = |volume: &str, target: &str, read_only| crate::engine::VolumeMount {
            volume: volume.into(),
            target: target.into(),
            read_only,
        };
        let into = mount("codebox-pkg-session", "/opt/codebox/session", false);
        let cache = |read_only| mount("codebox-pkg-abc", "/opt/codebox/packages", read_only);
        let pass = [
            vec![cache(false)],
            vec![cache(false), into.clone()],
            vec![cache(true), into.clone()],
        ];
        for volumes in pass {
            let c = copier(&plan(), &sandbox, volumes.clone());
            check_as(&c, &sandbox, Role::Copy).unwrap_or_else(|v| panic!("{volumes:?}: {v}"));
            assert!(
                check(&c, &sandbox).is_err(),
                "a program could write {volumes:?}"
            );
        }
        let refused = [
            ("nothing to copy into", vec![]),
            ("only a volume to read", vec![cache(true)]),
            (
                "two to read",
                vec![
                    cache(true),
                    mount("codebox-pkg-x", "/opt/x", true),
                    into.clone(),
                ],
            ),
            (
                "one inside the other",
                vec![
                    cache(true),
                    mount("codebox-pkg-x", "/opt/codebox/packages/x", false),
                ],
            ),
            (
                "at one place",
                vec![
                    cache(true),
                    mount("codebox-pkg-x", "/opt/codebox/packages/", false),
                ],
            ),
            (
                "not a prefix",
                vec![mount("someones-data", "/opt/x", false)],
            ),
            (
                "out of /opt",
                vec![mount("codebox-pkg-x", "/opt/../etc", false)],
            ),
        ];
        for (what, volumes) in refused {
            let c = copier(&plan(), &sandbox, volumes);
            assert!(check_as(&c, &sandbox, Role::Copy).is_err(), "{what}");
        }
        let mut stdin = copier(&plan(), &sandbox, vec![cache(false)]);
        stdin.open_stdin = true;
        assert!(check_as(&stdin, &sandbox, Role::Copy).is_err(), "stdin");
    }

    /// A directory as the proxy makes it: mode 0711, only a socket named proxy.sock.
    fn egress_dir() -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::net::UnixListener::bind(d.path().join(EGRESS_SOCKET)).unwrap();
        d
    }

    #[test]
    fn an_egress_mount_is_only_a_proxy_socket_directory_and_only_with_egress_hosts() {
        let mut sandbox = SandboxSettings::default();
        let dir = egress_dir();
        let mut run = spec();
        with_egress(&mut run, dir.path(), Some("localhost"));
        assert!(
            check(&run, &sandbox).is_err(),
            "egress without egress_hosts"
        );
        sandbox.egress_hosts = vec!["api.example".into()];
        check(&run, &sandbox).unwrap();
        assert!(check(&spec(), &sandbox).is_ok(), "egress is not required");
        let mut env = run.clone();
        env.env
            .insert(EGRESS_ENV.into(), "127.0.0.1:3128=/etc/x".into());
        assert!(check(&env, &sandbox).is_err(), "another socket path");
        for bad in ["relative/dir", "/tmp/../etc", "/nonexistent/codebox-egress"] {
            let mut s = run.clone();
            s.egress = Some(bad.into());
            assert!(check(&s, &sandbox).is_err(), "{bad}");
        }
        // A directory with anything else in it (a host folder, not the proxy's) is refused.
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        assert!(check(&run, &sandbox).is_err(), "a folder with a file in it");
        std::fs::remove_file(dir.path().join("secret")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check(&run, &sandbox).is_err(), "a world-writable directory");
    }

    #[test]
    fn scratch_space_never_exceeds_the_memory_limit() {
        let mut p = plan();
        p.limits.memory_mb = 32;
        p.workspace_mb = 16;
        let s = locked_down(&p, &SandboxSettings::default());
        assert!(s.tmpfs["/tmp"].contains("size=32m"), "{:?}", s.tmpfs);
        assert_eq!(s.shm_bytes, 32 * 1024 * 1024);
        check(&s, &SandboxSettings::default()).unwrap();
    }
}
