"""Each known model as its makers run it: the recipe data (`recipe`, `known`), the registry that
finds a model's recipe (`registry`), and the pure functions that apply one: sizes, chat messages,
and the makers' post-processing of the model's text (`sizes`, `messages`, `postprocess`,
`chandra_html`). Nothing here decodes, renders or loads a model."""
