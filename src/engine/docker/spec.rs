//! The create body for a locked-down spec, and the label filter of managed objects.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountBindOptions, MountBindOptionsPropagationEnum,
    MountType, MountVolumeOptions, ResourcesUlimits,
};

use crate::engine::{ContainerSpec, LABEL_MANAGED};

pub(super) fn to_hash(labels: &BTreeMap<String, String>) -> HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(super) fn managed_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])])
}

/// The create body for a spec. Every field that matters for isolation is set explicitly.
pub(super) fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let host_config = HostConfig {
        runtime: Some(spec.runtime.clone()),
        network_mode: Some(spec.network_mode.clone()),
        readonly_rootfs: Some(spec.readonly_rootfs),
        cap_drop: Some(spec.cap_drop.clone()),
        cap_add: Some(Vec::new()),
        security_opt: Some(spec.security_opt.clone()),
        privileged: Some(false),
        pids_limit: Some(spec.pids_limit),
        memory: Some(spec.memory_bytes),
        memory_swap: Some(spec.memory_swap_bytes),
        memory_swappiness: Some(0),
        cpu_quota: Some(spec.cpu_quota_us),
        cpu_period: Some(spec.cpu_period_us),
        tmpfs: Some(to_hash(&spec.tmpfs)),
        shm_size: Some(spec.shm_bytes),
        mounts: Some(
            spec.volumes
                .iter()
                .map(|v| Mount {
                    target: Some(v.target.clone()),
                    source: Some(v.volume.clone()),
                    typ: Some(MountType::VOLUME),
                    read_only: Some(v.read_only),
                    volume_options: Some(MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .chain(spec.egress.iter().map(|dir| Mount {
                    target: Some(crate::engine::posture::EGRESS_MOUNT.to_string()),
                    source: Some(dir.clone()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    bind_options: Some(MountBindOptions {
                        propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                        ..Default::default()
                    }),
                    ..Default::default()
                }))
                .collect(),
        ),
        binds: Some(Vec::new()),
        devices: Some(Vec::new()),
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|(name, v)| ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(*v),
                    hard: Some(*v),
                })
                .collect(),
        ),
        init: Some(spec.init),
        ipc_mode: Some("private".to_string()),
        // Output is streamed over attach and capped there; nothing is written to the
        // daemon's disk.
        log_config: Some(bollard::models::HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        auto_remove: Some(false),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        // Not the container id: nothing about the host or the daemon leaks through the name.
        hostname: Some("sandbox".to_string()),
        cmd: Some(spec.cmd.clone()),
        entrypoint: Some(Vec::new()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: Some(spec.user.clone()),
        working_dir: Some(spec.working_dir.clone()),
        labels: Some(to_hash(&spec.labels)),
        network_disabled: Some(spec.network_mode == "none"),
        open_stdin: Some(spec.open_stdin),
        stdin_once: Some(spec.open_stdin),
        attach_stdin: Some(spec.open_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}
