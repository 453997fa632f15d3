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
pub const INIT: &str = "/usr/local/bin/codebox-init";
/// The working directory: a size-capped tmpfs, writable, the only place programs may execute.
pub const WORKSPACE: &str = "/workspace";
/// Scratch space: a size-capped noexec tmpfs.
pub const SCRATCH: &str = "/tmp";
/// The first of the sandbox users every image creates (`sandbox`, then `sandbox2` ...): a
/// fact about the images (`images/base/Dockerfile`), relied on by the posture check and the
/// uid leases.
pub const SANDBOX_UID_FIRST: u32 = 10001;
/// How many sandbox users the images create: each container gets its own.
pub const SANDBOX_UIDS: u32 = 64;
/// The only environment the container has. The language's `env` reaches the program through
/// the payload (`docs/sandbox-init.md`).
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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
    }
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
pub const PACKAGES_VOLUME_PREFIX: &str = "codebox-pkg-";

/// What a container is for, as far as the posture check cares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Role<'a> {
    /// A run, compile or session container: no network; volumes only read-only prefixes.
    Run,
    /// An install container: the one install network, no volumes, its own runtime.
    Install { network: &'a str, runtime: &'a str },
    /// A container created only to copy an installed prefix into its volume, never started:
    /// the prefix's volume writable.
    Fill,
}

/// The install container's spec: the posture of every container, on the install network,
/// under `runtime`.
pub fn install(
    plan: &Plan,
    sandbox: &SandboxSettings,
    network: &str,
    runtime: &str,
) -> ContainerSpec {
    let mut spec = locked_down(plan, sandbox);
    spec.network_mode = network.to_string();
    spec.runtime = runtime.to_string();
    spec
}

/// The spec of a container that only receives an installed prefix into `volume` (at
/// `target`) and is removed without ever starting.
pub fn filler(plan: &Plan, sandbox: &SandboxSettings, volume: &str, target: &str) -> ContainerSpec {
    let mut spec = locked_down(plan, sandbox);
    spec.open_stdin = false;
    spec.volumes = vec![super::VolumeMount {
        volume: volume.to_string(),
        target: target.to_string(),
        read_only: false,
    }];
    spec
}

/// Mount a packages prefix volume read-only into a run's spec.
pub fn with_prefix(spec: &mut ContainerSpec, volume: &str, target: &str) {
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
pub fn check_as(
    spec: &ContainerSpec,
    sandbox: &SandboxSettings,
    role: Role<'_>,
) -> Result<(), PostureViolation> {
    let fail = |m: String| Err(PostureViolation(m));
    for v in &spec.volumes {
        if !v.volume.starts_with(PACKAGES_VOLUME_PREFIX) || !v.target.starts_with("/opt/") {
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
    if role == Role::Fill && (spec.volumes.len() != 1 || spec.open_stdin) {
        return fail("a filler has exactly one volume and no stdin".into());
    }
    let (network, runtime) = match role {
        Role::Install { network, runtime } => (network, runtime),
        _ => ("none", sandbox.runtime.as_str()),
    };
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
    if spec.network_mode != network || network.is_empty() || network == "host" {
        return fail(format!(
            "network mode is `{}`, not `{network}`",
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
    fn only_a_read_only_prefix_volume_and_only_the_install_network_pass() {
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

        let net = "codebox-install-x";
        let role = Role::Install {
            network: net,
            runtime: "runc",
        };
        let inst = install(&plan(), &sandbox, net, "runc");
        check_as(&inst, &sandbox, role).unwrap();
        let mut other_runtime = inst.clone();
        other_runtime.runtime = "weird".into();
        assert!(check_as(&other_runtime, &sandbox, role).is_err());
        assert!(
            check(&inst, &sandbox).is_err(),
            "a run container got a network"
        );
        for wrong in ["bridge", "host", ""] {
            let mut s = inst.clone();
            s.network_mode = wrong.into();
            assert!(check_as(&s, &sandbox, role).is_err());
        }
        let mut with_vol = inst.clone();
        with_prefix(&mut with_vol, "codebox-pkg-abc", "/opt/codebox/packages");
        assert!(check_as(&with_vol, &sandbox, role).is_err());

        let fill = filler(
            &plan(),
            &sandbox,
            "codebox-pkg-abc",
            "/opt/codebox/packages",
        );
        check_as(&fill, &sandbox, Role::Fill).unwrap();
        assert!(check(&fill, &sandbox).is_err());
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
