// UI preferences, the only thing the pages keep in the browser (localStorage): theme and
// the settings of new requests. Conversations live in the daemon's session log.

const KEY = "superfluid.prefs";
const DEFAULTS = { theme: "auto", model: "", system: "", temperature: 0.7, top_p: 1, max_tokens: 512, seed: "" };

export function load() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(KEY) || "{}") };
  } catch {
    return { ...DEFAULTS };
  }
}

export function save(p) {
  localStorage.setItem(KEY, JSON.stringify(p));
}

export function applyTheme(theme) {
  const dark = theme === "dark" || (theme === "auto" && matchMedia("(prefers-color-scheme: dark)").matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
}

// A button that cycles auto -> light -> dark.
export function themeButton(btn) {
  const p = load();
  const show = () => {
    applyTheme(p.theme);
    btn.textContent = { auto: "Theme: auto", light: "Theme: light", dark: "Theme: dark" }[p.theme];
  };
  btn.addEventListener("click", () => {
    p.theme = { auto: "light", light: "dark", dark: "auto" }[p.theme] || "auto";
    const cur = load();
    save({ ...cur, theme: p.theme });
    show();
  });
  show();
}
