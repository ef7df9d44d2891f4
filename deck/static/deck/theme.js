/* The Deck's theme before the first paint (loaded without defer in <head>: no inline script, CSP-safe). */
try { var deckTheme = localStorage.getItem("deck-theme"); if (deckTheme) document.documentElement.dataset.theme = deckTheme; } catch (e) { /* private mode */ }
