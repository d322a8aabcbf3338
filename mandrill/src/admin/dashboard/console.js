// The dashboard's controls. The admin token lives in the #token field and
// nowhere else: sent as a bearer header with each action and each refresh,
// never stored, never shown. A refresh replaces only #live, so what the
// operator typed stays.
"use strict";
const field = (id) => document.getElementById(id);
const outcome = field("outcome");

function headers(body) {
  const sent = {};
  if (field("token").value) sent.Authorization = "Bearer " + field("token").value;
  if (body) sent["Content-Type"] = "application/json";
  return sent;
}

async function refresh() {
  try {
    const answer = await fetch("/", { headers: headers(false), cache: "no-store" });
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const live = page.getElementById("live");
    if (live) field("live").replaceWith(document.adoptNode(live));
  } catch (error) {
    outcome.textContent = "refresh failed: " + error;
  }
}

// A button with data-post: POST its path with who and why (and its group);
// a campaign's stop (data-reason-only) sends the reason alone.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-post]");
  if (!button) return;
  if (!field("token").value || !field("by").value) {
    outcome.textContent = "enter the admin token and your name first";
    return;
  }
  const body = { reason: field("reason").value || "no reason given" };
  if (!("reasonOnly" in button.dataset)) body.by = field("by").value;
  if (button.dataset.group) body.group = button.dataset.group;
  outcome.textContent = button.textContent + "…";
  try {
    const answer = await fetch(button.dataset.post, {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(body),
    });
    outcome.textContent = button.textContent + ": " + answer.status + " " + (await answer.text());
  } catch (error) {
    outcome.textContent = button.textContent + ": " + error;
  }
  await refresh();
});

// Refreshed at once when a token is pasted (it may show more), then
// every few seconds.
field("token").addEventListener("change", refresh);
setInterval(refresh, 1000 * Number(document.body.dataset.refreshSeconds));
