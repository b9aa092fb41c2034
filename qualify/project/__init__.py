"""The project file: loading and validating it (``load``), qualify's edits to it (``edit``), the
view ``matrix show`` reads (``view``), ``qualify init`` (``init``) and the model's declared edges
(``graph``)."""
