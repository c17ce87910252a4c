//! The service files in `deploy/`: the systemd units pass `systemd-analyze
//! verify`, and the Kubernetes manifests read as YAML and hang together
//! (names, mounts, probes, the pipeline the scaler watches). No broker and
//! no cluster needed; the manifests were never applied to a real cluster
//! (deploy/kubernetes/README.md says so).

use crate::support::{read_yaml, repo, strings, Scratch};
use serde_json::Value;
use std::process::Command;

/// The hardening both units promise.
const HARDENING: [&str; 11] = [
    "DynamicUser=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "NoNewPrivileges=yes",
    "PrivateTmp=yes",
    "CapabilityBoundingSet=",
    "Restart=on-failure",
    "RestartPreventExitStatus=2",
    "KillSignal=SIGTERM",
    "SystemCallFilter=@system-service",
    "WantedBy=multi-user.target",
];

/// `systemd-analyze verify` accepts both units of deploy/systemd with
/// nothing to say: no unknown key, no value it cannot parse, the program
/// each starts exists (the built binary stands in for
/// /usr/local/bin/dlqctl, which the Debian package makes /usr/bin/dlqctl)
/// and each `Documentation=man:` page resolves (to the pages `dlqctl man
/// --out` writes). The hardening each promises is there; the worker has a
/// state directory of its own; serve's token never is an argument.
#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let tool = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        tool.as_ref().is_ok_and(|o| o.status.success()),
        "systemd-analyze is needed to check deploy/systemd and was not found or does not run \
         ({tool:?}): install systemd (apt-get install systemd; .ci/run does)"
    );
    let scratch = Scratch::new();
    let bin = env!("CARGO_BIN_EXE_dlqctl");
    let man = scratch.path().join("man/man1");
    std::fs::create_dir_all(&man).expect("a man directory");
    let pages = Command::new(bin)
        .arg("man")
        .arg("--out")
        .arg(&man)
        .output()
        .expect("dlqctl man --out");
    assert!(pages.status.success(), "dlqctl man --out failed");
    // `systemd-analyze verify` of `text` as unit `name`, with the man pages.
    let verify = |name: &str, text: &str| {
        let copy = scratch.path().join(name);
        std::fs::write(&copy, text).expect("a copy of the unit");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .env("MANPATH", scratch.path().join("man"))
            .output()
            .expect("systemd-analyze verify");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    for (name, exec, own) in [
        (
            "dlqctl-work@.service",
            "ExecStart=/usr/local/bin/dlqctl work ",
            ["StateDirectory=dlqctl/%i", "TimeoutStopSec=45s"],
        ),
        (
            "dlqctl-serve.service",
            "ExecStart=/usr/local/bin/dlqctl serve ",
            [
                "EnvironmentFile=/etc/dlqctl/serve.env",
                "TimeoutStopSec=30s",
            ],
        ),
    ] {
        let unit = std::fs::read_to_string(repo(&format!("deploy/systemd/{name}"))).expect(name);
        for line in HARDENING.iter().chain(&own) {
            let found = unit.lines().any(|l| l.trim() == *line);
            assert!(found, "{name} lacks `{line}`");
        }
        let start = unit.lines().find(|l| l.starts_with("ExecStart="));
        assert!(
            start.is_some_and(|l| l.starts_with(exec)),
            "{name}: {start:?}"
        );
        assert!(
            !unit.contains("--auth-token"),
            "{name}: a token in the arguments"
        );
        let unit = unit.replace("/usr/local/bin/dlqctl", bin);
        let (ok, said) = verify(name, &unit);
        assert!(
            ok && said.trim().is_empty(),
            "systemd-analyze verify {name}:\n{said}"
        );
    }
    let unit = std::fs::read_to_string(repo("deploy/systemd/dlqctl-work@.service")).expect("unit");
    assert!(unit.contains("--queue %i"), "{unit}");

    // The check has teeth: a misspelt key is reported.
    let bad = unit.replace("ProtectSystem=strict", "ProtectSystem=strictest");
    let (_, said) = verify("bad@.service", &bad.replace("/usr/local/bin/dlqctl", bin));
    assert!(said.contains("strictest"), "a bad value went unnoticed");
}

/// The arguments after `name` in a container's args.
fn after<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| *a == name)
        .and_then(|i| args.get(i + 1).copied())
}

/// The container's mount of the topology ConfigMap, as its mount path.
fn topology_mount(pod: &Value, container: &Value) -> String {
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["configMap"]["name"] == "dlqctl-topology")
        .expect("a volume of the ConfigMap dlqctl-topology");
    let name = volume["name"].as_str().expect("a volume name");
    let mount = container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == name)
        .expect("the topology volume mounted");
    assert_eq!(mount["readOnly"], true, "{mount}");
    mount["mountPath"]
        .as_str()
        .expect("a mountPath")
        .to_string()
}

/// The container's AMQP_URL comes from the Secret `dlqctl-broker`.
fn assert_broker_secret(container: &Value) {
    let env = container["env"].as_array().expect("env");
    let url = env
        .iter()
        .find(|e| e["name"] == "AMQP_URL")
        .expect("AMQP_URL set");
    assert_eq!(url["valueFrom"]["secretKeyRef"]["name"], "dlqctl-broker");
    assert_eq!(url["valueFrom"]["secretKeyRef"]["key"], "amqp-url");
}

fn assert_hardened(pod: &Value, container: &Value) {
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{pod}");
    let sc = &container["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    assert_eq!(strings(&sc["capabilities"]["drop"]), vec!["ALL"], "{sc}");
}

/// A worker Deployment `d` (kind, selector, arguments, probes on the
/// metrics port, grace, Secret, hardening) on a pipeline of `topology`:
/// its name, its pipeline and its arguments.
fn check_worker<'a>(d: &'a Value, topology: &dlqctl::Topology) -> (String, String, Vec<&'a str>) {
    assert_eq!(d["kind"], "Deployment");
    assert_eq!(d["apiVersion"], "apps/v1");
    let name = d["metadata"]["name"].as_str().expect("a name").to_string();
    let selector = d["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selector {
        assert_eq!(&labels[k], v, "the selector does not select the pods");
    }
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    assert_eq!(args[0], "work");
    let at = topology_mount(pod, c);
    assert_eq!(args[1], format!("{at}/topology.yaml"));
    let queue = after(&args, "--queue").expect("--queue");
    assert!(
        topology.pipeline(queue).is_some(),
        "--queue {queue} is not a pipeline of the ConfigMap"
    );
    assert!(after(&args, "--wait-for-broker").is_some(), "{args:?}");
    let metrics: std::net::SocketAddr = after(&args, "--metrics-addr")
        .expect("--metrics-addr")
        .parse()
        .expect("a socket address");
    assert!(
        metrics.ip().is_unspecified(),
        "the kubelet probes the pod's address: --metrics-addr must listen on 0.0.0.0"
    );
    let port = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["containerPort"] == metrics.port())
        .expect("the metrics port declared");
    let port_name = port["name"].as_str().expect("a port name");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert!(
            get["port"] == port_name || get["port"] == metrics.port(),
            "{probe} is not on the metrics port: {get}"
        );
    }
    let grace: u64 = after(&args, "--grace")
        .map(|g| {
            dlqctl::core::values::duration::parse_cli_duration(g)
                .expect("a duration")
                .as_secs()
        })
        .unwrap_or(30);
    let termination = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        termination > grace,
        "terminationGracePeriodSeconds {termination} must exceed --grace {grace} s"
    );
    assert_broker_secret(c);
    assert_hardened(pod, c);

    (name, queue.to_string(), args)
}

/// The web page: a Deployment of `dlqctl serve` on the ConfigMap's
/// topology, listening on the pod's address with its probes there, its
/// token from the Secret `dlqctl-serve` in the environment and never in
/// the arguments, the dlqctl image (as `job`'s), a writable /tmp for the
/// export files; a Service selecting its pods on that port.
fn check_serve(job: &Value) {
    let d = read_yaml("deploy/kubernetes/serve-deployment.yaml");
    assert_eq!(d["kind"], "Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        job["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    let args = strings(&c["args"]);
    assert_eq!(args[0], "serve");
    assert_eq!(args[1], format!("{}/topology.yaml", topology_mount(pod, c)));
    assert!(!args.iter().any(|a| a.contains("auth-token")), "{args:?}");
    let listen: std::net::SocketAddr = after(&args, "--listen")
        .expect("--listen")
        .parse()
        .expect("a socket address");
    assert!(
        listen.ip().is_unspecified(),
        "the Service reaches the pod's address"
    );
    let env = c["env"].as_array().expect("env");
    let token = env
        .iter()
        .find(|e| e["name"] == "DLQCTL_AUTH_TOKEN")
        .expect("DLQCTL_AUTH_TOKEN set");
    let secret = read_yaml("deploy/kubernetes/serve-secret.yaml");
    assert_eq!(secret["kind"], "Secret");
    let key = &token["valueFrom"]["secretKeyRef"];
    assert_eq!(key["name"], secret["metadata"]["name"]);
    let key = key["key"].as_str().expect("a key");
    assert!(
        secret["stringData"][key].is_string(),
        "the Secret has no {key}"
    );
    let port = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["containerPort"] == listen.port())
        .expect("the listen port declared");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], port["name"], "{probe}");
    }
    let tmp = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"] == "/tmp");
    assert!(tmp.is_some(), "no writable /tmp for the export files");
    assert_broker_secret(c);
    assert_hardened(pod, c);

    let svc = read_yaml("deploy/kubernetes/serve-service.yaml");
    assert_eq!(svc["kind"], "Service");
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_object().expect("a selector") {
        assert_eq!(&labels[k], v, "the Service does not select the page's pods");
    }
    let target = &svc["spec"]["ports"][0]["targetPort"];
    assert!(
        target == &port["name"] || target == &port["containerPort"],
        "{target}"
    );
}

#[test]
fn the_kubernetes_manifests_hang_together() {
    let cm = read_yaml("deploy/kubernetes/configmap.yaml");
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "dlqctl-topology");
    let topology_text = cm["data"]["topology.yaml"].as_str().expect("topology.yaml");
    // The topology is valid, as `dlqctl validate` reads it.
    let scratch = Scratch::new();
    let file = scratch.write("topology.yaml", topology_text);
    let topology = dlqctl::load_topology(&file).expect("the ConfigMap's topology is valid");

    let job = read_yaml("deploy/kubernetes/provision-job.yaml");
    assert_eq!(job["kind"], "Job");
    assert_eq!(job["apiVersion"], "batch/v1");
    let pod = &job["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    let at = topology_mount(pod, c);
    assert_eq!(args, vec!["provision", &format!("{at}/topology.yaml")]);
    assert_broker_secret(c);
    assert_hardened(pod, c);
    assert_eq!(pod["restartPolicy"], "OnFailure");

    let d = read_yaml("deploy/kubernetes/deployment.yaml");
    let (name, queue, args) = check_worker(&d, &topology);
    assert!(args.contains(&"--"), "no handler after --: {args:?}");
    let http = read_yaml("deploy/kubernetes/deployment-http.yaml");
    let (_, http_queue, http_args) = check_worker(&http, &topology);
    assert_ne!(
        http_queue, queue,
        "the --http example runs another pipeline"
    );
    let url = after(&http_args, "--http").expect("--http URL");
    assert!(
        url.starts_with("http://") || url.starts_with("https://"),
        "{url}"
    );
    assert!(
        !http_args.contains(&"--"),
        "an --http worker runs no program: {http_args:?}"
    );
    // Only the dlqctl image: the one the provisioning Job runs.
    let image = &http["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(
        image,
        &job["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    check_serve(&job);

    let so = read_yaml("deploy/kubernetes/scaledobject.yaml");
    assert_eq!(so["kind"], "ScaledObject");
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    assert_eq!(so["spec"]["scaleTargetRef"]["name"], name.as_str());
    let trigger = &so["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "rabbitmq");
    assert_eq!(trigger["metadata"]["queueName"], queue.as_str());
    assert_eq!(trigger["metadata"]["mode"], "QueueLength");
    assert!(
        trigger["metadata"]["value"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|v| v > 0),
        "{trigger}"
    );
    let min = so["spec"]["minReplicaCount"].as_u64().expect("min");
    let max = so["spec"]["maxReplicaCount"].as_u64().expect("max");
    assert!(min >= 1 && max > min, "{min}..{max}");
    let auth = trigger["authenticationRef"]["name"].as_str().expect("auth");

    let ta = read_yaml("deploy/kubernetes/triggerauthentication.yaml");
    assert_eq!(ta["kind"], "TriggerAuthentication");
    assert_eq!(ta["metadata"]["name"], auth);
    let host = &ta["spec"]["secretTargetRef"][0];
    assert_eq!(host["parameter"], "host");
    assert_eq!(host["name"], "dlqctl-broker");
    assert_eq!(host["key"], "amqp-url");

    let readme = std::fs::read_to_string(repo("deploy/kubernetes/README.md")).expect("README");
    assert!(readme.contains("Not applied to a real cluster"), "{readme}");
    // The image's recipe says, here and in the README, that it was never
    // built (no container engine on the machines that test this), and
    // starts the binary where the Debian package puts it.
    let containerfile =
        std::fs::read_to_string(repo("deploy/kubernetes/Containerfile")).expect("Containerfile");
    assert!(containerfile.contains("NEVER BUILT"), "{containerfile}");
    assert!(readme.contains("never built"), "{readme}");
    assert!(
        containerfile.contains(r#"ENTRYPOINT ["/usr/bin/dlqctl"]"#),
        "{containerfile}"
    );
}
