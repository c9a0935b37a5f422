// celery_outbox dashboard: action buttons (confirm, then a same-origin POST to the JSON API)
// and live refresh of the [data-live] blocks while the page is visible. No build step.
(function () {
  "use strict";
  const base = document.body.dataset.base || "";
  const REFRESH_MS = 5000;

  function flash(text, ok) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.className = ok ? "ok" : "";
    box.hidden = false;
  }

  async function act(button) {
    if (!window.confirm(button.dataset.confirm || "Are you sure?")) return;
    let body = null;
    if (button.dataset.action === "trigger" && button.dataset.kind === "queue") {
      const text = window.prompt("Payload (a JSON object):", "{}");
      if (text === null) return;
      try { body = JSON.stringify({ payload: JSON.parse(text) }); }
      catch (e) { flash("The payload is not JSON: " + e.message, false); return; }
    }
    button.disabled = true;
    try {
      const response = await fetch(button.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "Accept": "application/json" },
        body: body,
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) {
        const fields = (data.errors || []).map((e) => e.field + ": " + e.message).join("; ");
        flash((data.detail || response.statusText) + (fields ? " (" + fields + ")" : ""), false);
        return;
      }
      if (data.new_execution_id) {
        window.location.href = base + "/executions/" + data.new_execution_id;
      } else {
        window.location.reload();
      }
    } catch (e) {
      flash("Request failed: " + e.message, false);
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button.action");
    if (button) { event.preventDefault(); act(button); }
  });

  async function refresh() {
    if (document.hidden || !document.querySelector("[data-live]")) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      document.querySelectorAll("[data-live]").forEach((block) => {
        const fresh = block.id && page.getElementById(block.id);
        if (fresh) block.replaceWith(fresh);
      });
      const status = page.getElementById("status");
      const current = document.getElementById("status");
      if (status && current) current.replaceWith(status);
    } catch (e) { /* offline for a moment: try again next time */ }
  }
  setInterval(refresh, REFRESH_MS);
})();
