//! Labels, reruns and bulk actions: runs found by their labels, a rerun linked to its
//! run, and a bulk cancel and retry over a filter, counted by a dry run first.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};

fn labelled(team: &str) -> Value {
    let mut spec = run_spec(vec![json!({"key": "s", "argv": ["true"]})], 1);
    spec["labels"] = json!({"team": team, "env": "test"});
    spec
}

fn ctl(cluster: &Cluster, args: &[&str]) -> (i32, String) {
    let out = cluster.cairnctl().args(args).output().expect("cairnctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{text}{err}"))
}

fn states(cluster: &Cluster, ids: &[String]) -> Vec<String> {
    ids.iter()
        .map(|id| cluster.run(id)["state"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn runs_are_found_by_label_rerun_and_cancelled_or_retried_in_bulk() {
    let _services = ServiceLock::shared().await;
    // No worker: every run stays queued until acted on.
    let cluster = Cluster::start("bulk", 0, Settings::default()).await;
    let search: Vec<String> = (0..3)
        .map(|_| cluster.submit(&labelled("search")).0)
        .collect();
    let ads: Vec<String> = (0..2).map(|_| cluster.submit(&labelled("ads")).0).collect();
    let mut bad = labelled("x");
    bad["labels"] = json!({"Team!": "x"});
    let (status, error) = cluster.call("POST", "/api/v1/runs", Some(&bad));
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (422, Some("labels.Team!")),
        "{error}"
    );

    let (status, page) = cluster.call("GET", "/api/v1/runs?label=team=search,env=test", None);
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(3), "{page}");
    assert_eq!(page["runs"][0]["labels"]["team"], "search");
    let (status, error) = cluster.call("GET", "/api/v1/runs?label=team", None);
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (400, Some("label")),
        "{error}"
    );
    // A pair given twice is asked once; one key asked two values matches nothing: a 422.
    let (status, page) = cluster.call("GET", "/api/v1/runs?label=team=search,team=search", None);
    assert_eq!(
        (status, page["runs"].as_array().map(Vec::len)),
        (200, Some(3)),
        "{page}"
    );
    let (status, error) = cluster.call("GET", "/api/v1/runs?label=team=search,team=ads", None);
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (422, Some("label")),
        "{error}"
    );

    // A dry run counts and changes nothing; --yes acts.
    let (code, said) = ctl(
        &cluster,
        &["runs", "bulk", "cancel", "--label", "team=search"],
    );
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("3 runs match") && said.contains("--yes"),
        "{said}"
    );
    assert_eq!(states(&cluster, &search), ["queued"; 3]);
    let (code, said) = ctl(
        &cluster,
        &[
            "runs",
            "bulk",
            "cancel",
            "--label",
            "team=search",
            "--since",
            "1h",
            "--yes",
        ],
    );
    assert_eq!(code, 0, "{said}");
    assert_eq!(states(&cluster, &search), ["cancelled"; 3], "{said}");
    assert_eq!(
        states(&cluster, &ads),
        ["queued"; 2],
        "another label is left alone"
    );
    let (status, error) = cluster.call(
        "POST",
        "/api/v1/runs/bulk",
        Some(&json!({"action": "cancel", "filter": {}})),
    );
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (422, Some("filter")),
        "{error}"
    );

    // A rerun is a new run from the same spec, linked to it.
    let (code, said) = ctl(&cluster, &["--json", "runs", "rerun", &search[0]]);
    assert_eq!(code, 0, "{said}");
    let rerun: Value = serde_json::from_str(&said).expect("JSON");
    assert_eq!(rerun["rerun_of"], search[0].as_str());
    assert_eq!(
        (rerun["state"].as_str(), rerun["labels"]["team"].as_str()),
        (Some("queued"), Some("search"))
    );
    assert_eq!(rerun["steps"], cluster.run(&search[0])["steps"]);

    // Retry in bulk: every cancelled search run gets a rerun.
    let body = json!({"action": "retry", "filter": {"state": "cancelled", "labels": {"team": "search"}}, "dry_run": true});
    let (status, counted) = cluster.call("POST", "/api/v1/runs/bulk", Some(&body));
    assert_eq!(
        (status, counted["matched"].as_i64()),
        (200, Some(3)),
        "{counted}"
    );
    assert!(counted["outcomes"].as_array().is_some_and(Vec::is_empty));
    let mut body = body;
    body["dry_run"] = json!(false);
    let (status, done) = cluster.call("POST", "/api/v1/runs/bulk", Some(&body));
    assert_eq!(status, 200, "{done}");
    let outcomes = done["outcomes"].as_array().expect("outcomes");
    assert_eq!(outcomes.len(), 3, "{done}");
    for outcome in outcomes {
        assert_eq!(outcome["outcome"], "rerun");
        let new_run = cluster.run(outcome["new_run_id"].as_str().expect("a new run"));
        assert_eq!(new_run["rerun_of"], outcome["run_id"], "{new_run}");
    }
}
