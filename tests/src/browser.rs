//! A real headless browser for the console's tests: Debian's Chromium, driven through
//! Debian's ChromeDriver (WebDriver) with fantoccini. Nothing is downloaded at run time;
//! `scripts/test` installs both packages by name when they are missing.

use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// The widths every page is checked at: a desktop and a phone.
pub const WIDTHS: [u32; 2] = [1440, 390];

/// The pinned axe-core that `scripts/browser` installs from the npm registry.
pub const AXE_VERSION: &str = "4.14.1";

/// axe-core's script: `CAIRN_AXE_JS`, or where `scripts/browser` puts it.
fn axe_source() -> String {
    let path = std::env::var_os("CAIRN_AXE_JS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(format!(
                ".cache/cairn-tools/axe-core-{AXE_VERSION}/node_modules/axe-core/axe.min.js"
            ))
        });
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/browser (it installs axe-core {AXE_VERSION} from npm)",
            path.display()
        )
    })
}

/// Where screenshots go: `target/console-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("console-screenshots")
}

pub struct Browser {
    driver: Child,
    pub client: Client,
    profile: PathBuf,
    /// The scheduler's origin, `http://127.0.0.1:PORT`.
    pub base: String,
}

/// Chromium's console, through ChromeDriver's log endpoint (every entry since the last read).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.into()))
    }
}

impl Browser {
    pub async fn start(api: std::net::SocketAddr) -> Browser {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(path).exists(),
                "{path} is missing: install Debian's chromium and chromium-driver (scripts/test does)"
            );
        }
        let port = crate::free_addr().port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile =
            std::env::temp_dir().join(format!("cairn-chromium-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&profile).expect("profile dir");
        let mut caps = Capabilities::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                // Root in a container: no Chromium sandbox. The machine has no network, so
                // everything that would reach out at start is off.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars", "--disable-breakpad",
                    "--disable-crash-reporter",
                    format!("--user-data-dir={}", profile.display()), "--window-size=1440,900"],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from chromedriver: {e}"),
            }
        };
        Browser {
            driver,
            client,
            profile,
            base: format!("http://{api}"),
        }
    }

    /// Opens a console route (`#/runs`…).
    pub async fn open(&self, route: &str) {
        self.client
            .goto(&format!("{}/{route}", self.base))
            .await
            .expect("navigate");
    }

    /// Signs in with `token` from the sign-in form, by keyboard alone: focus starts in
    /// the token field and Enter submits.
    pub async fn sign_in(&self, token: &str) {
        self.client
            .goto(&format!("{}/", self.base))
            .await
            .expect("open");
        self.client
            .execute("sessionStorage.clear(); localStorage.clear();", vec![])
            .await
            .expect("clear storage");
        self.client.refresh().await.expect("reload");
        // A module request that Chromium dropped when the host's network changed (other
        // tests' sandboxes make and remove namespaces) leaves the page unstarted: it is
        // loaded once more, and a page that fails twice fails the test.
        let started = self
            .client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css("#token"))
            .await;
        if started.is_err() {
            self.client.refresh().await.expect("reload");
        }
        let field = self.wait_for("#token").await;
        let focused = self.client.active_element().await.expect("focus");
        assert_eq!(
            focused.attr("id").await.expect("id").as_deref(),
            Some("token"),
            "the token field does not have the focus"
        );
        field
            .send_keys(&format!("{token}\u{E007}"))
            .await
            .expect("type the token");
        self.wait_text("#who", "·").await;
    }

    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
    }

    /// Waits until the text of `css` contains `needle`; returns that text.
    pub async fn wait_text(&self, css: &str, needle: &str) -> String {
        self.wait_text_for(css, needle, Duration::from_secs(20))
            .await
    }

    pub async fn wait_text_for(&self, css: &str, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(el) = self.client.find(Locator::Css(css)).await {
                if let Ok(text) = el.text().await {
                    if text.contains(needle) {
                        return text;
                    }
                    last = text;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let console = self.console_problems().await;
        panic!("{css} never said {needle:?}; it said {last:?}; the console said {console:#?}")
    }

    /// Types `keys` (WebDriver key codes allowed: Tab is `\u{E004}`, Enter `\u{E007}`) into
    /// the focused element.
    pub async fn press(&self, keys: &str) {
        let focused = self.client.active_element().await.expect("focus");
        focused.send_keys(keys).await.expect("keys");
    }

    /// The visible buttons' labels.
    pub async fn buttons(&self) -> Vec<String> {
        let found = self
            .client
            .execute(
                "return [...document.querySelectorAll('button')].filter(b => b.offsetParent !== null).map(b => b.textContent.trim());",
                vec![],
            )
            .await
            .expect("buttons");
        serde_json::from_value(found).unwrap_or_default()
    }

    /// Clicks the visible button labelled exactly `label`.
    pub async fn click(&self, label: &str) {
        let xpath = format!("//button[normalize-space(.)='{label}']");
        // The console re-renders as it polls: a button found just before a render is
        // gone by the click, and the new one is found again.
        for _ in 0..5 {
            let button = self
                .client
                .wait()
                .at_most(Duration::from_secs(20))
                .for_element(Locator::XPath(&xpath))
                .await
                .unwrap_or_else(|e| panic!("no button {label:?}: {e}"));
            match button.click().await {
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference => {}
                clicked => return clicked.expect("click"),
            }
        }
        panic!("the button {label:?} was re-rendered under each of 5 clicks");
    }

    /// What Chromium's console said since the last read, errors and warnings only.
    pub async fn console_problems(&self) -> Vec<String> {
        let log = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("read the browser console (ChromeDriver's log endpoint)");
        log.as_array()
            .into_iter()
            .flatten()
            .filter(|e| matches!(e["level"].as_str(), Some("SEVERE" | "WARNING")))
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            // Chromium drops the requests in flight when the host's network changes,
            // which other tests' step sandboxes do as they make and remove their
            // namespaces: that is the machine, not the page (a page that lost a module
            // fails its own assertions).
            .filter(|m| !m.contains("net::ERR_NETWORK_CHANGED"))
            .collect()
    }

    /// Checks the page as shown now, at each width: every control is labelled, nothing
    /// overflows the viewport, the console is clean. Saves a screenshot per width as
    /// `target/console-screenshots/{name}-{width}.png`.
    pub async fn check_page(&self, name: &str) {
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        for width in WIDTHS {
            self.client
                .set_window_size(width, 900)
                .await
                .expect("resize");
            tokio::time::sleep(Duration::from_millis(300)).await;
            let audit = self
                .client
                .execute(AUDIT, vec![])
                .await
                .expect("audit the page");
            let png = self.client.screenshot().await.expect("screenshot");
            std::fs::write(dir.join(format!("{name}-{width}.png")), png).expect("save screenshot");
            let mut problems: Vec<String> = serde_json::from_value(audit).unwrap_or_default();
            problems.extend(self.accessibility().await);
            assert!(problems.is_empty(), "{name} at {width} px: {problems:#?}");
        }
        self.client
            .set_window_size(1440, 900)
            .await
            .expect("resize");
        let console = self.console_problems().await;
        assert!(console.is_empty(), "{name}: the console said {console:#?}");
    }

    /// axe-core's serious and critical violations on the page as shown now (WCAG 2.x A
    /// and AA rules and its best practices), one line each with up to three elements.
    pub async fn accessibility(&self) -> Vec<String> {
        let loaded = self
            .client
            .execute("return typeof axe !== 'undefined';", vec![])
            .await
            .expect("look for axe");
        if loaded != Value::Bool(true) {
            // Evaluated through the driver, not as a page script: the console's CSP allows
            // no script but its own.
            self.client
                .execute(&format!("{}\nreturn true;", axe_source()), vec![])
                .await
                .expect("load axe-core");
        }
        let found = self
            .client
            .execute_async(AXE_RUN, vec![])
            .await
            .expect("run axe-core");
        as_strings(found)
    }

    /// Ends the WebDriver session (Chromium quits), then the driver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// Also after a failed assertion: Chromium outlives a killed ChromeDriver, so every
    /// process started with this test's profile directory is killed.
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let marker = format!("--user-data-dir={}", self.profile.display());
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&marker) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Lists what a person using a keyboard or a screen reader could not use, and what the
/// viewport cuts off: unlabelled inputs, selects and buttons, and a page wider than the
/// window (tables scroll inside their own region instead).
const AUDIT: &str = r#"
const problems = [];
for (const el of document.querySelectorAll('input, select, textarea')) {
  if (el.type === 'hidden') continue;
  const labelled = (el.id && document.querySelector(`label[for="${el.id}"]`)) || el.getAttribute('aria-label') || el.closest('label');
  if (!labelled) problems.push(`unlabelled ${el.tagName.toLowerCase()} ${el.name || el.id || ''}`);
}
for (const b of document.querySelectorAll('button, a[href]')) {
  if (b.offsetParent !== null && !b.textContent.trim() && !b.getAttribute('aria-label')) problems.push(`a ${b.tagName.toLowerCase()} without a name`);
}
// Prose only: JSON shown in <pre> may say null.
const prose = document.body.cloneNode(true);
prose.querySelectorAll('pre, code').forEach(e => e.remove());
const words = prose.textContent;
for (const bad of ['[object ', 'undefined', 'NaN']) {
  if (words.includes(bad)) problems.push(`the page shows ${JSON.stringify(bad)}`);
}
if (/\bnull\b/.test(words)) problems.push('the page shows "null"');
if (document.documentElement.scrollWidth > window.innerWidth + 1) {
  const wide = [...document.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
    .slice(-3).map(e => `${e.tagName.toLowerCase()}.${e.className} (${Math.round(e.getBoundingClientRect().right)} px, scrollWidth ${e.scrollWidth})`);
  problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window (${document.documentElement.clientWidth} px client, ${document.body.scrollWidth} px body): ${wide.join(', ')}`);
}
return problems;
"#;

/// Runs axe-core on the document and returns its serious and critical violations.
const AXE_RUN: &str = r#"
const done = arguments[arguments.length - 1];
axe.run(document, { resultTypes: ['violations'] }).then((r) => done(r.violations
  .filter((v) => v.impact === 'serious' || v.impact === 'critical')
  .map((v) => `axe ${v.impact} ${v.id}: ${v.help} (${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join('; ')})`)))
  .catch((e) => done([`axe-core failed: ${e}`]));
"#;

/// The JSON of a `fantoccini` script result, for assertions.
pub fn as_strings(value: Value) -> Vec<String> {
    serde_json::from_value(value).unwrap_or_default()
}
