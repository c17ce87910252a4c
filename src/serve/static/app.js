// dlqctl serve: the little the pages do in the browser. Everything works
// without it but the live job progress and the overview's refresh.
"use strict";

function csrf() {
  return document.body.dataset.csrf || "";
}

function text(el, value) {
  if (el) el.textContent = value === null || value === undefined ? "" : String(value);
}

// A job's page: polls /api/jobs/ID until the job ends.
function followJob(box) {
  const id = box.dataset.jobId;
  const field = (name) => box.querySelector('[data-field="' + name + '"]');
  async function poll() {
    let job;
    try {
      const r = await fetch("/api/jobs/" + encodeURIComponent(id), {
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      if (!r.ok) throw new Error("HTTP " + r.status);
      job = await r.json();
    } catch (e) {
      text(field("poll-error"), "cannot read the job: " + e.message + "; trying again");
      setTimeout(poll, 2000);
      return;
    }
    text(field("poll-error"), "");
    const p = job.progress;
    box.dataset.state = job.state;
    text(field("state"), job.state);
    text(field("total"), p.total);
    text(field("read"), p.read);
    text(field("selected"), p.selected);
    text(field("done"), p.done);
    text(field("failed"), p.failed);
    text(field("elapsed"), (job.elapsed_ms / 1000).toFixed(1) + " s");
    text(field("dlq-messages"), job.dlq_messages === null ? "?" : job.dlq_messages);
    text(field("error"), job.error || "");
    const bar = field("bar");
    if (bar) {
      bar.max = Math.max(p.total, 1);
      bar.value = p.read;
    }
    if (job.state === "running") {
      setTimeout(poll, 500);
      return;
    }
    const cancel = box.querySelector("form.cancel");
    if (cancel) cancel.remove();
    if (job.report) text(field("report"), JSON.stringify(job.report, null, 2));
    const dl = field("download");
    if (dl && job.download) {
      dl.href = job.download;
      dl.hidden = false;
    }
  }
  poll();
}

// The group page: the count of selected messages, for the purge check.
function countSelected(form) {
  const out = form.querySelector('[data-field="selected-count"]');
  const update = () =>
    text(out, form.querySelectorAll('input[name="message_id"]:checked').length);
  form.addEventListener("change", update);
  const all = form.querySelector("input.select-all");
  if (all) {
    all.addEventListener("change", () => {
      form
        .querySelectorAll('input[name="message_id"]:not(:disabled)')
        .forEach((c) => (c.checked = all.checked));
      update();
    });
  }
  update();
}

document.addEventListener("DOMContentLoaded", () => {
  const job = document.querySelector("[data-job-id]");
  if (job) followJob(job);
  const form = document.querySelector("form.messages");
  if (form) countSelected(form);
  const refresh = document.body.dataset.refreshMs;
  if (refresh) setTimeout(() => window.location.reload(), Number(refresh));
});
