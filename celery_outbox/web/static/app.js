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

  // A 4xx body's message: its field errors, each once (the detail repeats them), else
  // the detail.
  function problem(data, fallback) {
    const seen = [];
    (data.errors || []).forEach((e) => {
      const line = e.field + ": " + e.message;
      if (seen.indexOf(line) < 0) seen.push(line);
    });
    return seen.length ? seen.join("; ") : (data.detail || fallback);
  }

  async function act(button) {
    if (button.dataset.action === "trigger" && button.dataset.kind === "queue") {
      // A queue job's payload comes from its trigger form (built from the job's schema).
      window.location.href = button.dataset.url.replace("/api/v1/jobs/", "/jobs/");
      return;
    }
    if (!window.confirm(button.dataset.confirm || "Are you sure?")) return;
    const body = null;
    button.disabled = true;
    try {
      const response = await fetch(button.dataset.url, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "Accept": "application/json" },
        body: body,
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) {
        flash(problem(data, response.statusText), false);
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

  // Bulk selection on the executions page: "select all on this page", the count picked;
  // picking a row chooses "the selected" over "all matching".
  function picks() { return Array.from(document.querySelectorAll("input.pick")); }
  function counted() {
    const shown = document.getElementById("picked");
    const n = picks().filter((p) => p.checked).length;
    if (shown) shown.textContent = String(n);
    const page = document.getElementById("pick-page");
    if (page) page.checked = n > 0 && n === picks().length;
    return n;
  }
  document.addEventListener("change", (event) => {
    const target = event.target;
    if (target.id === "pick-page") {
      picks().forEach((p) => { p.checked = target.checked; });
    }
    if (target.id === "pick-page" || target.classList.contains("pick")) {
      const scope = document.querySelector("#bulk input[name=scope][value=ids]");
      if (counted() > 0 && scope) scope.checked = true;
    }
  });

  // A form marked data-once (a bulk confirmation, a trigger) is sent once: a double click
  // sends nothing more (the server would change nothing more anyway, and say so).
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!form.matches("form[data-once], form#bulk")) return;
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "1";
    // Disabled after the form's data is taken (a disabled submitter would not be sent).
    setTimeout(() => form.querySelectorAll("button[type=submit]")
      .forEach((b) => { b.disabled = true; }), 0);
  });
  window.addEventListener("pageshow", () => {  // back to a page kept by the browser
    document.querySelectorAll("form[data-sent]").forEach((form) => {
      delete form.dataset.sent;
      form.querySelectorAll("button[type=submit]").forEach((b) => { b.disabled = false; });
    });
    counted();
  });

  async function refresh() {
    if (document.hidden || !document.querySelector("[data-live]")) return;
    if (picks().some((p) => p.checked)) return;  // never drop what the operator picked
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
