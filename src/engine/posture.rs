//! The locked-down container spec: built in one function, re-checked before every create.
//!
//! # Security
//! [`locked_down`] is the only place a [`ContainerSpec`] is made. Callers may only tighten it
//! (lower limits, fewer mounts). [`check`] runs right before each create and refuses any spec
//! that lost a guarantee, so a bug elsewhere turns into a `sandbox_error`, never a weaker run.

use std::collections::BTreeMap;

use super::{ContainerSpec, Mount, MountKind};

/// Where the workspace volume is mounted in every container.
pub const WORKSPACE: &str = "/workspace";
/// Scratch space: a size-capped tmpfs.
pub const SCRATCH: &str = "/tmp";
/// The first of the sandbox users every image creates (`sandbox`, then `sandbox2` ...): a
/// fact about the images (`images/base/Dockerfile`), relied on by the posture check and the
/// uid leases.
pub const SANDBOX_UID_FIRST: u32 = 10001;
/// How many sandbox users the images create: each concurrent run gets its own.
pub const SANDBOX_UIDS: u32 = 64;
/// The only environment a program sees, besides its language's `env`.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What one container may use.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// The sandbox user (and group) the container runs as.
    pub uid: u32,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_limit: i64,
    pub tmpfs_mb: u64,
    pub max_file_size_mb: u64,
}

/// The workspace volume, and whether this stage may write to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub volume: String,
    pub writable: bool,
}

/// Build the locked-down spec for one container.
#[allow(clippy::too_many_arguments)]
pub fn locked_down(
    name: &str,
    image: &str,
    cmd: Vec<String>,
    language_env: &BTreeMap<String, String>,
    workspace: Option<Workspace>,
    resources: &Resources,
    labels: BTreeMap<String, String>,
    open_stdin: bool,
) -> ContainerSpec {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), BASE_PATH.to_string());
    env.insert("HOME".to_string(), SCRATCH.to_string());
    env.insert("TMPDIR".to_string(), SCRATCH.to_string());
    env.insert("LANG".to_string(), "C.UTF-8".to_string());
    for (k, v) in language_env {
        env.insert(k.clone(), v.clone());
    }
    let memory = (resources.memory_mb as i64) * 1024 * 1024;
    let scratch_mb = resources.tmpfs_mb.min(resources.memory_mb.max(1));
    let file_size = (resources.max_file_size_mb as i64) * 1024 * 1024;
    ContainerSpec {
        name: name.to_string(),
        image: image.to_string(),
        cmd,
        env,
        user: format!("{0}:{0}", resources.uid),
        working_dir: WORKSPACE.to_string(),
        labels,
        network_mode: "none".to_string(),
        readonly_rootfs: true,
        cap_drop: vec!["ALL".to_string()],
        cap_add: Vec::new(),
        security_opt: vec![
            "no-new-privileges".to_string(),
            super::seccomp::security_opt(),
        ],
        privileged: false,
        pids_limit: resources.pids_limit,
        memory_bytes: memory,
        memory_swap_bytes: memory,
        nano_cpus: (resources.cpus * 1e9).round() as i64,
        tmpfs: BTreeMap::from([(
            SCRATCH.to_string(),
            format!("rw,noexec,nosuid,nodev,size={scratch_mb}m,mode=1777"),
        )]),
        shm_bytes: (scratch_mb as i64) * 1024 * 1024,
        mounts: workspace
            .into_iter()
            .map(|w| Mount {
                kind: MountKind::Volume,
                source: w.volume,
                target: WORKSPACE.to_string(),
                read_only: !w.writable,
            })
            .collect(),
        devices: Vec::new(),
        ulimits: vec![
            ("fsize".to_string(), file_size),
            ("nofile".to_string(), 1024),
            ("core".to_string(), 0),
        ],
        open_stdin,
        init: true,
    }
}

/// A guarantee a spec lost.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("refusing to create a container whose spec is weaker than the sandbox posture: {0}")]
pub struct PostureViolation(pub String);

/// Which workspace access a stage is allowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WorkspaceAccess {
    /// Compile stage: the workspace volume may be writable.
    Writable,
    /// Run stage: the workspace must be read-only.
    ReadOnly,
}

/// Re-verify every critical flag of a spec. Called right before each create.
pub fn check(spec: &ContainerSpec, access: WorkspaceAccess) -> Result<(), PostureViolation> {
    let fail = |m: String| Err(PostureViolation(m));
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
    if !spec.cap_add.is_empty() {
        return fail(format!("capabilities added: {:?}", spec.cap_add));
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
    if seccomp.len() != 1 || *seccomp[0] != super::seccomp::security_opt() {
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
    if spec.pids_limit <= 0 {
        return fail(format!("pids limit is {}", spec.pids_limit));
    }
    if spec.memory_bytes <= 0 {
        return fail("no memory limit".into());
    }
    if spec.memory_swap_bytes != spec.memory_bytes {
        return fail("swap is allowed (memory+swap differs from memory)".into());
    }
    if spec.nano_cpus <= 0 {
        return fail("no CPU quota".into());
    }
    if spec.shm_bytes <= 0 || spec.shm_bytes > spec.memory_bytes {
        return fail(format!(
            "/dev/shm size {} is not within the memory limit",
            spec.shm_bytes
        ));
    }
    if !spec.devices.is_empty() {
        return fail(format!("devices: {:?}", spec.devices));
    }
    for (path, opts) in &spec.tmpfs {
        let opts: Vec<&str> = opts.split(',').collect();
        for required in ["noexec", "nosuid", "nodev"] {
            if !opts.contains(&required) {
                return fail(format!("tmpfs {path} lacks {required}"));
            }
        }
        if !opts.iter().any(|o| o.starts_with("size=")) {
            return fail(format!("tmpfs {path} has no size cap"));
        }
    }
    if !spec.tmpfs.contains_key(SCRATCH) {
        return fail(format!("no size-capped scratch tmpfs at {SCRATCH}"));
    }
    for m in &spec.mounts {
        if m.kind != MountKind::Volume {
            return fail(format!("host path {} is mounted", m.source));
        }
        if m.target != WORKSPACE {
            return fail(format!("unexpected mount at {}", m.target));
        }
        if access == WorkspaceAccess::ReadOnly && !m.read_only {
            return fail("the workspace is writable in the run stage".into());
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

    fn spec() -> ContainerSpec {
        locked_down(
            "c1",
            "img",
            vec!["true".into()],
            &BTreeMap::new(),
            Some(Workspace {
                volume: "v".into(),
                writable: false,
            }),
            &Resources {
                uid: 10001,
                memory_mb: 256,
                cpus: 1.0,
                pids_limit: 64,
                tmpfs_mb: 64,
                max_file_size_mb: 16,
            },
            BTreeMap::new(),
            false,
        )
    }

    #[test]
    fn locked_down_spec_passes_the_posture_check() {
        check(&spec(), WorkspaceAccess::ReadOnly).unwrap();
        let s = spec();
        assert_eq!(s.network_mode, "none");
        assert_eq!(s.memory_bytes, s.memory_swap_bytes);
        assert_eq!(s.user, "10001:10001");
        assert!(s.tmpfs["/tmp"].contains("noexec"));
    }

    type Weakening = Box<dyn Fn(&mut ContainerSpec)>;

    #[test]
    fn every_weakened_flag_is_refused() {
        let weakenings: Vec<(&str, Weakening)> = vec![
            ("network", Box::new(|s| s.network_mode = "bridge".into())),
            ("rootfs", Box::new(|s| s.readonly_rootfs = false)),
            ("root user", Box::new(|s| s.user = "0:0".into())),
            ("root name", Box::new(|s| s.user = "root".into())),
            ("empty user", Box::new(|s| s.user = String::new())),
            ("host user", Box::new(|s| s.user = "1000:1000".into())),
            ("cap_drop", Box::new(|s| s.cap_drop.clear())),
            ("cap_add", Box::new(|s| s.cap_add.push("SYS_ADMIN".into()))),
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
            ("memory", Box::new(|s| s.memory_bytes = 0)),
            ("swap", Box::new(|s| s.memory_swap_bytes = -1)),
            ("cpu", Box::new(|s| s.nano_cpus = 0)),
            ("device", Box::new(|s| s.devices.push("/dev/kvm".into()))),
            (
                "tmpfs exec",
                Box::new(|s| {
                    s.tmpfs.insert("/tmp".into(), "rw,size=64m".into());
                }),
            ),
            ("no tmpfs", Box::new(|s| s.tmpfs.clear())),
            ("rw workspace", Box::new(|s| s.mounts[0].read_only = false)),
            ("bind", Box::new(|s| s.mounts[0].kind = MountKind::Bind)),
            ("fsize", Box::new(|s| s.ulimits.clear())),
        ];
        for (name, weaken) in weakenings {
            let mut s = spec();
            weaken(&mut s);
            assert!(
                check(&s, WorkspaceAccess::ReadOnly).is_err(),
                "{name} was accepted"
            );
        }
    }

    #[test]
    fn compile_stage_may_write_the_workspace_only() {
        let mut s = spec();
        s.mounts[0].read_only = false;
        check(&s, WorkspaceAccess::Writable).unwrap();
        s.readonly_rootfs = false;
        assert!(check(&s, WorkspaceAccess::Writable).is_err());
    }
}
