//! The operator console in a real headless browser (Debian's Chromium over WebDriver):
//! sign-in per role, a run appearing and completing live, the saved-continuation flow
//! with a lost response, the policy screen keeping what it does not show, and a
//! verification approved in the page with its reused result labelled. Every page
//! is checked at 1440 and 390 px (labelled controls, no overflow, a clean console, no
//! serious axe-core violation) and
//! screenshotted under `target/console-screenshots/`.

use cairn_e2e::browser::Browser;
use cairn_e2e::cluster::{run_spec, Cluster, Settings, ADMIN};
use cairn_e2e::handoff::{build_check, id, verified_run, verify, Tree, LONG};
use serde_json::{json, Value};
use std::time::Duration;

/// One browser at a time: Chromium is heavy on a two-core machine.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Buttons that change something; a viewer is offered none of them.
const ACTIONS: [&str; 6] = [
    "Cancel run",
    "Pause",
    "Resume",
    "Continue saved task",
    "Save verification approval",
    "Create token",
];

fn token(cluster: &Cluster, name: &str, role: &str) -> String {
    let (status, created) = cluster.call(
        "POST",
        "/api/v1/tokens",
        Some(&json!({"name": name, "role": role})),
    );
    assert_eq!(status, 201, "{created}");
    created["token"].as_str().expect("token").to_string()
}

fn slow_run() -> Value {
    run_spec(
        vec![
            json!({"key": "think", "argv": ["sh", "-c", "echo thinking; sleep 60"], "timeout_seconds": 120}),
        ],
        1,
    )
}

#[tokio::test]
async fn each_role_sees_only_the_actions_it_may_take() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-roles", 1, Settings::default()).await;
    let viewer = token(&cluster, "ada-viewer", "viewer");
    let operator = token(&cluster, "otto-operator", "operator");
    let (run_id, _) = cluster.submit(&slow_run());
    cluster.wait_for_state(&run_id, &["running"], Duration::from_secs(60));
    let browser = Browser::start(cluster.api).await;

    // A viewer reads everything and is offered nothing to do.
    browser.sign_in(&viewer).await;
    browser.wait_text("#who", "ada-viewer · viewer").await;
    browser.open(&format!("#/runs/{run_id}")).await;
    browser.wait_text("main", "running at epoch 1 on w1").await;
    // The running step's output, live.
    browser.wait_text("main", "thinking").await;
    let shown = browser.buttons().await;
    for action in ACTIONS {
        assert!(
            !shown.iter().any(|b| b == action),
            "a viewer was offered {action:?}: {shown:?}"
        );
    }
    assert!(shown.iter().any(|b| b.starts_with("Download")), "{shown:?}");
    browser.check_page("run-viewer").await;
    browser.open("#/runs").await;
    let nav = browser.wait_text("#nav", "Runs").await;
    assert!(
        !nav.contains("Connections"),
        "a viewer sees Connections: {nav}"
    );
    browser.open("#/operations").await;
    browser.wait_text("main", "Workers").await;
    assert!(!browser.buttons().await.iter().any(|b| b == "Create token"));

    // An operator may cancel; the run is cancelled on the server.
    browser.sign_in(&operator).await;
    browser.open(&format!("#/runs/{run_id}")).await;
    browser.wait_text("main", "running at epoch 1 on w1").await;
    let shown = browser.buttons().await;
    assert!(shown.iter().any(|b| b == "Cancel run"), "{shown:?}");
    browser.check_page("run-operator").await;
    browser.click("Cancel run").await;
    browser
        .client
        .accept_alert()
        .await
        .expect("confirm the cancel");
    cluster.wait_for_state(&run_id, &["cancelled"], Duration::from_secs(30));
    browser.wait_text("main", "cancelled").await;

    // One reaper sweep, for Operations to show.
    let swept = std::process::Command::new(cairn_e2e::binary("cairn-reaper"))
        .arg("--once")
        .envs(cluster.isolation.env())
        .output()
        .expect("run the reaper");
    assert!(
        swept.status.success(),
        "{}",
        String::from_utf8_lossy(&swept.stderr)
    );

    // An admin also sees Connections and tokens.
    browser.sign_in(ADMIN).await;
    let nav = browser.wait_text("#nav", "Connections").await;
    assert!(nav.contains("Operations"), "{nav}");
    browser.open("#/operations").await;
    browser.wait_text("main", "ada-viewer").await;
    browser.wait_text("main", "Last sweeps, newest first").await;
    assert!(browser.buttons().await.iter().any(|b| b == "Create token"));
    browser.check_page("operations-admin").await;
    browser.close().await;
}

#[tokio::test]
async fn a_run_appears_and_completes_live() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-live", 1, Settings::default()).await;
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open("#/runs").await;
    browser.wait_text("#run-list", "No runs yet").await;

    // Submitted behind the page's back: the list shows it without a reload.
    let spec = run_spec(
        vec![
            json!({"key": "build", "argv": ["sh", "-c", "sleep 6; printf 'built \\000 ok\\n'"], "timeout_seconds": 60}),
        ],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    let row = browser.wait_text("#run-list", &run_id).await;
    assert!(
        row.contains("queued") || row.contains("running"),
        "the new run is not shown live: {row}"
    );
    browser.check_page("runs-live").await;
    browser
        .wait_text_for("#run-list", "completed", Duration::from_secs(60))
        .await;
    browser.wait_text(".counts", "1").await;

    // By keyboard: Tab reaches the run's link, Enter opens it.
    let mut reached = false;
    for _ in 0..40 {
        browser.press("\u{E004}").await;
        let focused = browser.client.active_element().await.expect("focus");
        if focused
            .attr("href")
            .await
            .ok()
            .flatten()
            .is_some_and(|h| h.contains(&run_id))
        {
            reached = true;
            break;
        }
    }
    assert!(reached, "Tab never reached the run's link");
    // A refresh that changes the list keeps the keyboard's place.
    let (second, _) = cluster.submit(&spec);
    browser.wait_text("#run-list", &second).await;
    let focused = browser.client.active_element().await.expect("focus");
    let href = focused
        .attr("href")
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    assert!(
        href.contains(&run_id),
        "the refresh moved the focus to {href:?}"
    );
    browser.press("\u{E007}").await;
    let page = browser.wait_text("main", "executed at epoch 1 by").await;
    assert!(
        page.contains("built \\x00 ok"),
        "the tail is not shown escaped: {page}"
    );
    // Its checkpoint lineage: the snapshot its receipt stands on.
    let snapshot = cluster.journal(&run_id)["steps"][0]["snapshot_id"]
        .as_str()
        .expect("a snapshot")
        .to_string();
    assert!(
        page.contains(&format!("build {snapshot}")),
        "no lineage row: {page}"
    );
    browser.check_page("run-completed").await;
    browser.close().await;
}

/// Puts the run's request where a lapsed lease with spent attempts leaves it.
async fn stop_at_checkpoint(cluster: &Cluster, request_id: &str) {
    let id = uuid::Uuid::parse_str(request_id).expect("a request id");
    cairn_common::testing::stop_at_checkpoint(&cluster.pool, id).await;
}

/// A Plan tab flow: its section id, its buttons and its first acknowledgement.
struct Flow {
    id: &'static str,
    check: &'static str,
    review: &'static str,
    first_ack: &'static str,
}

const SAVED_CONTINUATION: Flow = Flow {
    id: "checkpoint",
    check: "Check current admission",
    review: "Review saved continuation",
    first_ack: "acknowledge_retained_response_consumed_once",
};

const SAVED_RESULT: Flow = Flow {
    id: "final",
    check: "Check saved result",
    review: "Review saved result",
    first_ack: "acknowledge_already_consumed_final_output",
};

/// Plan → a flow: check, review, choose a 300 s window, acknowledge all four.
async fn review(browser: &Browser, run_id: &str, flow: &Flow) {
    let id = flow.id;
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    browser.click(flow.check).await;
    browser.wait_text(&format!("#flow-{id}"), "READY").await;
    browser.click(flow.review).await;
    let window = browser.wait_for(&format!("#flow-{id}-window")).await;
    window.clear().await.expect("clear");
    window.send_keys("300").await.expect("window");
    for ack in [
        flow.first_ack,
        "acknowledge_no_completed_effect_replay",
        "acknowledge_same_request_attempt_and_budgets",
        "acknowledge_finite_ownership_lease",
    ] {
        browser
            .wait_for(&format!("#flow-{id}-{ack}"))
            .await
            .click()
            .await
            .expect("acknowledge");
    }
}

async fn actions_saved(cluster: &Cluster, request_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM continuation_actions WHERE request_id = $1::uuid")
        .bind(request_id)
        .fetch_one(&cluster.pool)
        .await
        .expect("count actions")
}

#[tokio::test]
async fn the_saved_continuation_flow_survives_a_lost_response() {
    let _one = ONE_BROWSER.lock().await;
    // No worker: the admitted continuation stays queued for the readback to see.
    let cluster = Cluster::start("console-continuation", 0, Settings::default()).await;
    let (run_id, request_id) = cluster.submit(&slow_run());
    stop_at_checkpoint(&cluster, &request_id).await;
    let viewer = token(&cluster, "vera-viewer", "viewer");
    let browser = Browser::start(cluster.api).await;

    // Connections → Saved-work recovery → Review continuation settings.
    browser.sign_in(ADMIN).await;
    browser.open("#/connections").await;
    browser.click("Review continuation settings").await;
    browser
        .wait_for("#policy-enabled")
        .await
        .click()
        .await
        .expect("enable");
    browser
        .wait_for("#policy-allow")
        .await
        .click()
        .await
        .expect("allow");
    let window = browser.wait_for("#policy-window").await;
    window.clear().await.expect("clear");
    window.send_keys("900").await.expect("window");
    // Meanwhile another admin saves a setting this screen does not show.
    let (status, _) = cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"allow_final_outcome_continuation": true})),
    );
    assert_eq!(status, 200);
    browser.check_page("policy").await;
    browser.click("Save settings").await;
    browser
        .wait_text("main", "Other recovery settings kept")
        .await;
    let (_, policy) = cluster.call("GET", "/api/v1/invalid-read-continuity/policy", None);
    assert_eq!(policy["enabled"], true, "{policy}");
    assert_eq!(policy["allow_checkpoint_continuation"], true, "{policy}");
    assert_eq!(policy["maximum_window_seconds"], 900, "{policy}");
    assert_eq!(
        policy["allow_final_outcome_continuation"], true,
        "the policy screen overwrote a setting it does not show: {policy}"
    );

    // A viewer may check the candidate, and is offered nothing to admit it with.
    browser.sign_in(&viewer).await;
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    browser.click("Check current admission").await;
    browser
        .wait_text("#flow-checkpoint", "needs the admin role")
        .await;
    let shown = browser.buttons().await;
    assert!(
        !shown.iter().any(|b| b == "Review saved continuation"),
        "{shown:?}"
    );
    browser.check_page("plan-viewer").await;
    browser.sign_in(ADMIN).await;

    // Storage that cannot keep the decision: nothing is sent.
    review(&browser, &run_id, &SAVED_CONTINUATION).await;
    browser.check_page("plan-review").await;
    browser
        .client
        .execute(
            "Storage.prototype.setItem = function () { throw new Error('quota exceeded'); };",
            vec![],
        )
        .await
        .expect("break storage");
    browser.click("Continue saved task").await;
    browser.wait_text("#flow-checkpoint", "Not sent").await;
    assert_eq!(actions_saved(&cluster, &request_id).await, 0);

    // A refusal says so, and leaves nothing saved: the window outgrew the policy.
    browser.client.refresh().await.expect("reload");
    review(&browser, &run_id, &SAVED_CONTINUATION).await;
    let narrow = |seconds: u32| {
        let (status, policy) = cluster.call(
            "PUT",
            "/api/v1/invalid-read-continuity/policy",
            Some(&json!({"maximum_window_seconds": seconds})),
        );
        assert_eq!(status, 200, "{policy}");
    };
    narrow(120);
    browser.click("Continue saved task").await;
    browser
        .wait_text("#flow-checkpoint", "Refused, nothing was admitted")
        .await;
    assert_eq!(actions_saved(&cluster, &request_id).await, 0);
    // The refusal's 409 is the one failed load the console shows.
    let said = browser.console_problems().await;
    assert!(
        said.iter()
            .all(|m| m.contains("/actions/") && m.contains("409")),
        "{said:#?}"
    );
    narrow(900);

    // The POST arrives, its response is lost.
    browser.client.refresh().await.expect("reload");
    review(&browser, &run_id, &SAVED_CONTINUATION).await;
    browser
        .client
        .execute(
            "const real = window.fetch;
             window.fetch = async (url, init) => {
               const response = await real(url, init);
               if (init && init.method === 'POST' && String(url).includes('/actions/')) {
                 throw new TypeError('Failed to fetch');
               }
               return response;
             };",
            vec![],
        )
        .await
        .expect("lose responses");
    browser.click("Continue saved task").await;
    browser
        .wait_text("#flow-checkpoint", "response was lost")
        .await;
    assert_eq!(actions_saved(&cluster, &request_id).await, 1);
    browser.check_page("plan-lost-response").await;

    // After a reload the saved decision is shown, never offered for submission again,
    // and read back.
    browser.client.refresh().await.expect("reload");
    browser
        .wait_text("#flow-checkpoint", "saved in this browser")
        .await;
    let shown = browser.buttons().await;
    assert!(
        !shown.iter().any(|b| b == "Continue saved task"),
        "{shown:?}"
    );
    browser.click("Check saved continuation").await;
    let said = browser
        .wait_text("#flow-checkpoint", "Saved continuation confirmed")
        .await;
    assert!(said.contains("queued"), "{said}");
    let saved: Value = serde_json::from_value(
        browser
            .client
            .execute(
                "return JSON.parse(localStorage.getItem(Object.keys(localStorage).find(k => k.startsWith('cairn.decision.checkpoint.'))));",
                vec![],
            )
            .await
            .expect("saved decision"),
    )
    .expect("decision json");
    let (_, status) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/status"),
        None,
    );
    assert_eq!(status["action_id"], saved["action_id"], "{status}");
    assert_eq!(status["lease"]["valid_for_seconds"], 300, "{status}");
    assert_eq!(actions_saved(&cluster, &request_id).await, 1);
    browser.check_page("plan-readback").await;
    browser.close().await;
}

/// Chooses `provider` in the Agent questions tab's provider list.
async fn select_provider(browser: &Browser, provider: &str) {
    let option = browser
        .wait_for(&format!(
            "#verification-provider option[value='{provider}']"
        ))
        .await;
    option.click().await.expect("choose the provider");
}

#[tokio::test]
async fn verification_is_approved_in_the_console_and_reuse_is_labelled() {
    let _one = ONE_BROWSER.lock().await;
    let _services = cairn_e2e::ServiceLock::shared().await;
    let cluster = Cluster::start("console-verify", 1, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "fn main() {}",
        lock: "lock v1",
        mode: "a",
    };
    let spec = verified_run(&tree, json!([build_check(&effects)]));
    // The first verification executes the check, declared reusable.
    verify(&cluster, &spec, &id(1));

    // The second is approved in the console, reusing it.
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open(&format!("#/runs/{run_id}/questions")).await;
    browser
        .wait_text("#flow-verification", "Approve factory verification")
        .await;
    // Another provider than the run's configured one is refused, saying which.
    select_provider(&browser, "claude").await;
    browser.click("Read approved checks").await;
    browser
        .wait_text("#flow-verification", "the run's own agent (e2e)")
        .await;
    select_provider(&browser, "e2e").await;
    browser.click("Read approved checks").await;
    browser
        .wait_text("#flow-verification", "Frozen checks")
        .await;
    browser
        .wait_for("#reuse-1")
        .await
        .click()
        .await
        .expect("select");
    browser.click("Review verification approval").await;
    browser
        .wait_text("#flow-verification", "1 selected as reusable")
        .await;
    browser
        .wait_for("#verification-ack")
        .await
        .click()
        .await
        .expect("acknowledge");
    browser.check_page("verification-review").await;
    browser.click("Save verification approval").await;
    browser
        .wait_text("main", "Verification approval recorded")
        .await;
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let (_, adoptions) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/verification-handoffs/adoptions"),
        None,
    );
    assert_eq!(
        cluster.lines("effects"),
        ["built a"],
        "the check ran again: {adoptions}"
    );

    browser.open(&format!("#/runs/{run_id}/verification")).await;
    let results = browser
        .wait_text_for("main", "Reused prior verified result", LONG)
        .await;
    assert!(results.contains("reused from result"), "{results}");
    browser.check_page("verification-results").await;
    // After a reload, the saved approval reads back as this token's, with its outcome.
    browser.open(&format!("#/runs/{run_id}/questions")).await;
    browser.client.refresh().await.expect("reload");
    browser
        .wait_text("#flow-verification", "No verification waits for approval")
        .await;
    browser.click("Read saved verification approval").await;
    browser
        .wait_text("main", "Verification approval recorded: completed")
        .await;

    // The Plan tab's records: the reuse receipt, and the fresh round that finished it.
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    let records = browser
        .wait_text("#records", "New executions for referenced checks: 0")
        .await;
    assert!(
        records.contains("Finishing round: 0 commands, files written: none"),
        "{records}"
    );
    assert!(records.contains("Terminal acceptance"), "{records}");
    browser.check_page("plan-records").await;
    browser.close().await;
}

#[tokio::test]
async fn a_saved_agent_result_is_accepted_once_and_read_back() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-final", 0, Settings::default()).await;
    let (run_id, request_id) = cluster.submit(&slow_run());
    let request_uuid = uuid::Uuid::parse_str(&request_id).expect("uuid");
    cairn_common::testing::retain_unaccepted_report(&cluster.pool, request_uuid).await;
    allow_final_outcomes(&cluster);

    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    review(&browser, &run_id, &SAVED_RESULT).await;
    let shown = browser
        .wait_text("#flow-final", "blocked, next step: verification")
        .await;
    assert!(shown.contains("Claim window"), "{shown}");
    browser.check_page("plan-saved-result").await;
    browser.click("Accept saved result").await;
    browser
        .wait_text("#flow-final", "Saved result accepted")
        .await;
    assert_eq!(actions_saved(&cluster, &request_id).await, 1);

    browser.client.refresh().await.expect("reload");
    browser
        .wait_text("#flow-final", "saved in this browser")
        .await;
    assert!(!browser
        .buttons()
        .await
        .iter()
        .any(|b| b == "Accept saved result"));
    browser.click("Read saved action").await;
    let said = browser
        .wait_text("#flow-final", "Saved result accepted: action")
        .await;
    assert!(said.contains("is queued"), "{said}");
    assert_eq!(actions_saved(&cluster, &request_id).await, 1);
    browser.close().await;
}

/// A completed run is published from the Plan tab: a delivery hold is set and released
/// there, the publication is saved in the browser before its one POST, and after a
/// reload it reads back to its delivery receipt.
#[tokio::test]
async fn a_completed_run_is_published_from_the_console_and_read_back_after_a_reload() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-publish", 1, Settings::default()).await;
    let spec = run_spec(
        vec![json!({"key": "write", "argv": ["sh", "-c", "echo hello > greeting.txt"]})],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["completed"], LONG);

    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    browser
        .wait_text("#flow-publication", "Delivery hold")
        .await;
    let reason = browser.wait_for("#delivery-hold-reason").await;
    reason.send_keys("legal review").await.expect("reason");
    browser.click("Set delivery hold").await;
    browser
        .wait_text("#flow-publication", "held: legal review")
        .await;
    let (_, hold) = cluster.call("GET", &format!("/api/v1/runs/{run_id}/delivery-hold"), None);
    assert_eq!(hold["held"], true, "{hold}");
    browser.click("Release delivery hold").await;
    browser
        .wait_text("#flow-publication", "Delivery hold released")
        .await;

    publish(&browser).await;
    browser.check_page("plan-publication").await;
    browser.client.refresh().await.expect("reload");
    browser
        .wait_text("#flow-publication", "saved in this browser")
        .await;
    let said = read_publication(&browser).await;
    assert!(said.contains("1 file changed"), "{said}");
    let (_, requests) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/execution-requests"),
        None,
    );
    assert_eq!(
        requests["execution_requests"].as_array().map(Vec::len),
        Some(2),
        "one publication was sent: {requests}"
    );
    browser.close().await;
}

/// The whole journey in the browser: the saved result accepted (with a reload between
/// the submission and its readback), the verification approved on the Agent questions
/// tab, the fresh round's records on the Plan tab, and the result published and read
/// back to its receipt.
#[tokio::test]
async fn the_journey_in_the_console() {
    let _one = ONE_BROWSER.lock().await;
    let _services = cairn_e2e::ServiceLock::shared().await;
    let mut cluster = Cluster::start("console-journey", 0, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "fn main() {}",
        lock: "lock v1",
        mode: "a",
    };
    let spec = verified_run(&tree, json!([build_check(&effects)]));
    cluster.add_faulty_worker("w1", "before_completion");
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    allow_final_outcomes(&cluster);

    // The saved result, accepted once; the page reloads before it is read back.
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    review(&browser, &run_id, &SAVED_RESULT).await;
    browser.click("Accept saved result").await;
    browser
        .wait_text("#flow-final", "Saved result accepted")
        .await;
    browser.client.refresh().await.expect("reload");
    browser
        .wait_text("#flow-final", "saved in this browser")
        .await;
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    browser.click("Read saved action").await;
    browser
        .wait_text("#flow-final", "Saved result accepted: action")
        .await;

    // The verification, approved on the Agent questions tab.
    browser.open(&format!("#/runs/{run_id}/questions")).await;
    browser.click("Read approved checks").await;
    browser
        .wait_text("#flow-verification", "Frozen checks")
        .await;
    browser.click("Review verification approval").await;
    browser
        .wait_for("#verification-ack")
        .await
        .click()
        .await
        .expect("acknowledge");
    browser.click("Save verification approval").await;
    browser
        .wait_text("main", "Verification approval recorded")
        .await;
    cluster.wait_for_state(&run_id, &["completed"], LONG);

    // The records of the fresh round, then the publication.
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    let records = browser.wait_text("#records", "Terminal acceptance").await;
    assert!(
        records.contains("Finishing round: 0 commands, files written: none"),
        "{records}"
    );
    publish(&browser).await;
    let said = read_publication(&browser).await;
    assert!(said.contains("2 files changed"), "{said}");
    browser.check_page("journey-published").await;
    browser.close().await;
}

/// Plan → Publication: acknowledge the receipts, publish once.
async fn publish(browser: &Browser) {
    browser
        .wait_for("#publication-ack")
        .await
        .click()
        .await
        .expect("acknowledge");
    browser.click("Publish result").await;
    browser
        .wait_text("#flow-publication", "Publication requested")
        .await;
}

/// Reads the saved publication back until it shows its delivery receipt; what it said.
async fn read_publication(browser: &Browser) -> String {
    let mut said = String::new();
    for _ in 0..60 {
        browser.click("Read publication").await;
        said = browser.wait_text("#flow-publication", "Publication").await;
        if said.contains("SHA-256") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    said
}

/// Turns on final-outcome continuations in the recovery policy.
fn allow_final_outcomes(cluster: &Cluster) {
    let (status, _) = cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_final_outcome_continuation": true})),
    );
    assert_eq!(status, 200);
}

/// Sandboxes: the list shows one created behind the page's back; its page shows its
/// services and ports, runs a command whose output appears as it is printed, and lists
/// the command in its journal.
#[tokio::test]
async fn a_sandbox_page_runs_a_command_and_shows_its_output_as_it_is_printed() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-sandbox", 1, Settings::default()).await;
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open("#/sandboxes").await;
    browser
        .wait_text("#sandbox-list", "No sandboxes match")
        .await;
    let serve = json!({"argv": ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"]});
    let (status, created) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "console", "ports": [8080], "services": {"web": serve}})),
    );
    assert_eq!(status, 201, "{created}");
    let id = created["sandbox_id"].as_str().expect("id").to_string();
    browser.wait_text("#sandbox-list", &id).await;
    browser
        .wait_text_for("#sandbox-list", "running", Duration::from_secs(60))
        .await;
    browser.check_page("sandboxes").await;

    browser.open(&format!("#/sandboxes/{id}")).await;
    browser
        .wait_text("main", "python3 -m http.server 8080")
        .await;
    browser.wait_text("main", "web started").await;
    let command = browser.wait_for("#exec-command").await;
    command
        .send_keys("for i in 1 2 3; do echo line$i; sleep 1; done; echo oops >&2")
        .await
        .expect("command");
    browser.click("Run").await;
    // The first line shows while the command still runs.
    let early = browser.wait_text("#exec-stdout", "line1").await;
    assert!(
        !early.contains("line3"),
        "not shown as it was printed: {early}"
    );
    browser.wait_text("#exec-stdout", "line3").await;
    browser.wait_text("#exec-stderr", "oops").await;
    browser.wait_text("main", "Exited 0.").await;
    browser.wait_text("main", "exit 0").await;
    browser.check_page("sandbox").await;
    browser.close().await;
}

/// A run that needs a person shows its uncertain step and what is known of it; a viewer
/// is offered no decision, an operator marks the step not done with a reason, the run
/// completes, and the journal's records say who decided and why.
#[tokio::test]
async fn an_operator_decides_an_uncertain_step_in_the_console() {
    let _one = ONE_BROWSER.lock().await;
    let (cluster, run_id) =
        cairn_e2e::interrupted::die_after_second_intent("console-reconcile").await;
    let viewer = token(&cluster, "ada-viewer", "viewer");
    let operator = token(&cluster, "otto-operator", "operator");
    cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);

    let browser = Browser::start(cluster.api).await;
    browser.sign_in(&viewer).await;
    browser.open(&format!("#/runs/{run_id}")).await;
    browser
        .wait_text("main", "An operator decides this step.")
        .await;
    let offered = browser.buttons().await;
    for decision in ["Mark done", "Mark not done", "Fail run"] {
        assert!(!offered.iter().any(|b| b == decision), "{offered:?}");
    }

    browser.sign_in(&operator).await;
    browser.open(&format!("#/runs/{run_id}")).await;
    browser.wait_text("main", "Needs a person").await;
    browser.check_page("run-needs-a-person").await;
    let reason = browser
        .wait_for("input[aria-label='Why, for step s2']")
        .await;
    reason
        .send_keys("s2 never wrote its line")
        .await
        .expect("type the reason");
    browser.click("Mark not done").await;
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(
        cluster.lines("effects"),
        ["s1", "s2"],
        "s2 ran once, after the decision"
    );
    browser.open(&format!("#/runs/{run_id}/plan")).await;
    let said = browser
        .wait_text("#records", "Step s2 mark not done by otto-operator")
        .await;
    assert!(said.contains("s2 never wrote its line"), "{said}");
    browser.close().await;
}

/// A running step's output arrives in the run page without a reload and the page
/// follows its end; scrolled up, it stops following until "Jump to the end".
#[tokio::test]
async fn a_running_steps_output_arrives_live_and_follows_its_end() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-tail", 1, Settings::default()).await;
    let script = "i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo \"line $i\"; sleep 0.05; done";
    let spec = run_spec(
        vec![json!({"key": "talk", "argv": ["sh", "-c", script], "timeout_seconds": 120})],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["running"], Duration::from_secs(60));
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open(&format!("#/runs/{run_id}")).await;
    // A mark on the window: a reload would take it away.
    browser
        .client
        .execute("window.cairnNotReloaded = true;", vec![])
        .await
        .expect("mark the page");
    let tail = "pre[aria-label='talk live stdout']";
    browser.wait_text(tail, "line 20").await;
    let following = |_: ()| async {
        browser
            .client
            .execute(
                "const p = document.querySelector(arguments[0]);
                 return [p.dataset.following, p.scrollTop + p.clientHeight >= p.scrollHeight - 4, p.textContent.length];",
                vec![json!(tail)],
            )
            .await
            .expect("read the tail")
    };
    browser.wait_text(tail, "line 60").await;
    let state = following(()).await;
    assert_eq!(state[0], "true", "{state}");
    assert_eq!(
        state[1], true,
        "the end of the output is not shown: {state}"
    );
    browser.check_page("run-live-output").await;

    // Scrolled up: new lines still arrive, and the view stays where the operator put it.
    browser
        .client
        .execute(
            "const p = document.querySelector(arguments[0]); p.scrollTop = 0; p.dispatchEvent(new Event('scroll'));",
            vec![json!(tail)],
        )
        .await
        .expect("scroll up");
    let before = following(()).await;
    // About ten lines more than were shown when scrolled: a slow browser may already be
    // past any fixed line by then.
    let grown = |from: &Value| {
        let from = from[2].as_u64().unwrap_or(0);
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let now = following(()).await;
                if now[2].as_u64().unwrap_or(0) >= from + 100 {
                    return now;
                }
                assert!(std::time::Instant::now() < deadline, "no new lines: {now}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let after = grown(&before).await;
    assert_eq!(after[0], "false", "{after}");
    assert!(after[2].as_u64() > before[2].as_u64(), "{before} {after}");
    let top: Value = browser
        .client
        .execute(
            "return document.querySelector(arguments[0]).scrollTop;",
            vec![json!(tail)],
        )
        .await
        .expect("scroll position");
    assert_eq!(top, json!(0), "the page moved the operator's view");
    browser.click("Jump to the end").await;
    grown(&after).await;
    let again = following(()).await;
    assert_eq!(again[0], "true", "{again}");
    assert_eq!(again[1], true, "{again}");
    let kept = browser
        .client
        .execute("return window.cairnNotReloaded === true;", vec![])
        .await
        .expect("the mark");
    assert_eq!(kept, json!(true), "the page was reloaded");
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(60));
    browser.close().await;
}

/// The overview draws the fleet's samples, and a tenant's token is told the overview is
/// not its own; a browser with no token is asked for one.
#[tokio::test]
async fn the_overview_draws_the_fleet() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-overview", 1, Settings::default()).await;
    let (run_id, _) = cluster.submit(&run_spec(vec![json!({"key": "ok", "argv": ["true"]})], 1));
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(60));
    let browser = Browser::start(cluster.api).await;
    browser.open("#/overview").await;
    browser.wait_for("#token").await;
    browser.check_page("sign-in").await;
    browser.sign_in(ADMIN).await;
    browser.open("#/overview").await;
    browser.wait_for("#chart-runs svg[role=img]").await;
    // Samples come every second here: the live worker is drawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let label = browser
            .client
            .execute(
                "return document.querySelector('#chart-workers svg').getAttribute('aria-label');",
                vec![],
            )
            .await
            .expect("label");
        if label.as_str().is_some_and(|l| l.contains("now 1")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no worker drawn: {label}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    browser.check_page("overview").await;

    let (status, _) = cluster.call(
        "POST",
        "/api/v1/tenants",
        Some(&json!({"tenant_id": "acme"})),
    );
    assert_eq!(status, 201);
    let (status, made) = cluster.call(
        "POST",
        "/api/v1/tokens",
        Some(&json!({"name": "acme-viewer", "role": "viewer", "tenant": "acme"})),
    );
    assert_eq!(status, 201, "{made}");
    browser
        .sign_in(made["token"].as_str().expect("token"))
        .await;
    browser.open("#/overview").await;
    browser.wait_text("main", "a platform token shows it").await;
    browser.check_page("overview-tenant").await;
    browser.close().await;
}

/// The runs list is searched from its address (shareable): by agent and by the start of
/// an id; fifty runs a page, the next page by its keyset cursor in the address.
#[tokio::test]
async fn a_search_of_the_runs_lives_in_the_address() {
    let _one = ONE_BROWSER.lock().await;
    let cluster = Cluster::start("console-search", 1, Settings::default()).await;
    let mut ids = Vec::new();
    for i in 0..53 {
        let mut spec = run_spec(vec![json!({"key": "ok", "argv": ["true"]})], 1);
        spec["agent"] = json!(if i == 0 { "finder" } else { "bulk" });
        ids.push(cluster.submit(&spec).0);
    }
    for id in &ids {
        cluster.wait_for_state(id, &["completed"], Duration::from_secs(120));
    }
    let browser = Browser::start(cluster.api).await;
    browser.sign_in(ADMIN).await;
    browser.open("#/runs?agent=finder").await;
    browser.wait_text("#run-list", &ids[0]).await;
    let listed = browser.wait_text("#run-list", "finder").await;
    assert!(!listed.contains(&ids[1]), "{listed}");
    browser.check_page("runs-search").await;
    browser
        .open(&format!("#/runs?run_id={}", &ids[5][..10]))
        .await;
    browser.wait_text("#run-list", &ids[5]).await;
    browser.open("#/runs").await;
    let first = browser.wait_text("#run-list", &ids[52]).await;
    assert!(!first.contains(&ids[0]), "{first}");
    let next = browser
        .client
        .find(fantoccini::Locator::LinkText("Next page"))
        .await
        .expect("a next page link");
    next.click().await.expect("next page");
    browser.wait_text("#run-list", &ids[0]).await;
    let hash: Value = browser
        .client
        .execute("return location.hash;", vec![])
        .await
        .expect("hash");
    assert!(
        hash.as_str().is_some_and(|h| h.contains("cursor=")),
        "{hash}"
    );
    browser.close().await;
}
