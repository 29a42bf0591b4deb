"""Geometric diagnostics of private mergeability: Sec. 3.2 and App. B.4 of "When Privacy Hurts Mergeability"
(arXiv 2608.26655), one module per diagnostic.

- drift: reference drift of the task models from the pretrained weights (Fig. 3b).
- interpolation: the loss path from a task model to the merged model and its barrier height (Fig. 2).
- curvature: the sharpness proxy (Fig. 3a), lambda_max of the Hessian (Eq. 3) and the measured merge gap beside
  Theorem 5.2's bound.
- linearity: the joint-task linearity gap of Theorem C.8 and its second-order bound.
- landscape: 2-D loss landscapes around a merge (App. B.4, Figs. 4, 5) on filter-normalised or task-vector planes.
- common: the parameter-mapping types and algebra they share, and task_loss, L_t as a function of a backbone's
  top parameters.

This file imports nothing, so importing the package costs nothing; import the module a diagnostic lives in.
"""
