//! The real engine behind the server: `tf_engine::serve::EngineHandle` (the engine thread).

use tf_engine::serve::{
    EngineHandle, EngineStats, GenerateRequest, ModelInfo, Submission, SubmitError,
};

use crate::Engine;

impl Engine for EngineHandle {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitError> {
        EngineHandle::submit(self, req)
    }

    fn stats(&self) -> EngineStats {
        EngineHandle::stats(self)
    }

    fn info(&self) -> &ModelInfo {
        EngineHandle::info(self)
    }

    fn shutdown(&self) {
        EngineHandle::shutdown(self)
    }
}
