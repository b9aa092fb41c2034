"""The project file: loading and validating it (``load``), what is wrong with it and how a
message says so (``problems``), the checks beyond its model (``checks``), qualify's edits to it
(``edit``), the view ``matrix show`` reads (``view``), ``qualify init`` (``init``) and the
model's declared edges (``graph``)."""
